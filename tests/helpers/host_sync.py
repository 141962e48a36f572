"""Host synchronisations as errors, for the CUDA checks that a computation never waits for the GPU.

torch warns that its sync debug mode is a prototype that misses some synchronising operations;
tests/probmoe/test_checks_in_graph.py covers the value checks' path another way (on "meta"
tensors, which have no values to read), without a GPU."""

import contextlib

import torch


@contextlib.contextmanager
def no_host_synchronisation():
    """Inside the block, any host synchronisation (an ``.item()``, a data-dependent shape, a copy
    to the host) raises, after the work already queued has finished; the default mode after."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
