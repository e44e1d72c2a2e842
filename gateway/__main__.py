"""``python -m gateway``: the same as the ``tierstore`` console script."""

from gateway.cli import main

if __name__ == "__main__":
    main()
