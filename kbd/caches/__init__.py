"""Caches by content address, verified on every read: imported MLIR (`import_cache`), compiled
kernels as shared libraries (`compile_cache`), and the file format both use (`entries`)."""
