"""smplan: plan, simulate and run distributed deep-learning training."""

from smplan.library_logs import quiet_library_logs

__version__ = "0.1.0"

# Before anything imports transformers (which imports torchao when installed): every entry
# point (CLI, worker, benchmarks) imports this package first.
quiet_library_logs()
