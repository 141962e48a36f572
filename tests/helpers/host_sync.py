"""Host synchronisations as errors, for the CUDA checks that a computation never waits for the GPU."""

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
