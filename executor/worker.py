"""Entry point of one training process under torchrun: `python -m executor.worker CONFIG`."""

from __future__ import annotations

import sys

from .config import RunConfig
from .train import Trainer


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m executor.worker RUN_CONFIG.json")
    trainer = Trainer(RunConfig.load(argv[0]))
    try:
        trainer.run()
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
