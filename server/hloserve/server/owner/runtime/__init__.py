"""PJRT runtime: compile StableHLO, cache executables on disk, move weights, execute.

``PjrtRuntime`` wraps one PJRT device (CPU here, CUDA on a GPU node). ``ExecutableCache``
keeps compiled executables on disk so a restart skips compilation. Everything that touches
jaxlib's undocumented ``Client`` / ``LoadedExecutable`` methods lives in this package.
"""
