"""``python -m shardfmt``: the same command as the ``shardfmt`` console script."""

from ._cli import main

if __name__ == "__main__":
    main(prog_name="shardfmt")
