"""Kiln runtime side: the worker process, its engines, batchers and compilers."""
