"""`dpsql shell`'s terminal: an interactive prompt for private SQL, and scripts.

connection.py is what the shell is connected to (a Session in this process, or
a running `dpsql serve`), engine.py runs statements and meta-commands and prints
them, render.py draws releases and budgets, repl.py is the prompt
(prompt_toolkit). The subcommand that starts it is dpsql/cli/shell.py.
"""
