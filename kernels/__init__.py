"""Triton kernels, each beside a plain-PyTorch reference (imports as ``clover_agent.kernels``).

One folder per operator (the flash-linear-attention layout): ``reference.py`` is the plain-PyTorch
function (the engine's CPU path), ``triton_kernels.py`` the ``@triton.jit`` code, a launcher module
the public functions, exported by the folder's ``__init__``. ``runtime.available()`` says whether
the Triton versions can run here (Triton installed, and a CUDA device or ``TRITON_INTERPRET=1``
set before Triton was imported). ``bench`` builds each kernel's benchmark case at Clover's sizes.
"""
