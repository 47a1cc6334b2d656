"""`python cli.py COMMAND ...`: the same as the installed `genoformer` command."""

from genoformer.cli import main

if __name__ == "__main__":
    main()
