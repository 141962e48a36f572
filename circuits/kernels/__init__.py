"""The kernels: everything that computes, below the registered operators (``circuits.ops``) and the
evaluators (``circuits.Circuit``, ``circuits.CardinalityDP``). No module here imports one above.

    select.py           select: the one place that picks an implementation, from what is evaluated
                        (a circuit's Program, the DP's Lattice, Rows), its device and the dtype;
                        describe
    interface.py        Kernels (the fused queries chosen / chosen_backward, composed by default),
                        Passes (the circuit passes' interface), Sweeps (the DP's)
    program.py          Program: a level layout as device tensors; draw_uniforms
    torch_passes.py     TorchPasses: plain tensor operations (the meaning; the others' oracle)
    c_passes.py         CPasses: fused C for fp32 on the CPU
    triton_passes.py    TritonPasses: layer-parallel Triton kernels (triton_layers.py), fp32 on CUDA
    by_node.py          the passes' definition node by node in Python: TorchPasses' oracle (tests)
    lattice.py          Lattice: what the cardinality DP sweeps over
    torch_dp.py         TorchDP: the DP's sweeps in plain torch (the meaning; the C sweeps' oracle)
    c_dp.py             CDP: the DP's sweeps fused in C for fp32 on the CPU
    triton_dp.py        TritonDP: the DP's sweeps as Triton kernels for fp32 on CUDA (one token per
                        thread, the lattice in registers), from the sources triton_lattice.py writes
    rows.py             Rows, RowOps: topk, topk_chosen, kth_largest (C or torch references)
    uniforms.py         counter-based uniforms from one seed (C or the torch reference)
    straight_through.py Eq. 7's weights and their gradient in torch, the score kinds (a public module)
    scratch.py          ScratchPool: reused [rows, T] buffers
    library.py          LIBRARY: the one C library (per ISA) of c/, its ctypes declarations
    build.py            NativeLibrary: C sources built on first use, loaded with ctypes (no torch;
                        other packages link its shared units, VMATH and SCRATCH)
    c/                  the C sources and their one header, kernels.h

Nothing is imported here: ``circuits.kernels.build`` loads without torch (``probmoe-compile``).
"""
