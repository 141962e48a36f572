"""The kernels: everything that computes, below the operators (``circuits.ops``) and the evaluators.

    select.py           select: the one place that picks an implementation, from what is evaluated
                        (a circuit's Program, the DP's Lattice, Rows), its device and the dtype
    interface.py        Passes: the interface of the circuit passes
    program.py          Program: a level layout as device tensors; draw_uniforms
    torch_passes.py     TorchPasses: plain tensor operations (the meaning; the others' oracle)
    c_passes.py         CPasses: fused C for fp32 on the CPU
    triton_passes.py    TritonPasses: fused Triton kernels (triton_kernels.py) for fp32 on CUDA
    by_node.py          the passes' definition node by node in Python: TorchPasses' oracle (tests)
    lattice.py          Lattice: what the cardinality DP sweeps over
    torch_dp.py         TorchDP: the DP's sweeps in plain torch (the meaning; the C sweeps' oracle)
    c_dp.py             CDP: the DP's sweeps fused in C for fp32 on the CPU
    rows.py             topk, topk_chosen, kth_largest: per-row selection (C or torch)
    uniforms.py         counter-based uniforms from one seed (C or torch)
    straight_through.py Eq. 7's weights and their gradient in torch; the score kinds
    scratch.py          ScratchPool: reused [rows, T] buffers
    build.py            NativeLibrary: C sources built on first use, loaded with ctypes
    c/                  the C sources

Nothing is imported here: ``circuits.kernels.build`` loads without torch (``probmoe-compile``).
"""
