"""The command line: `eagle3 VERB ARGS`, one module per verb (eagle3/cli/verbs.py lists them).

The top room: a verb module parses its arguments, calls the library and prints what it returns; no library module
imports from here, and none parses arguments (tests/test_imports.py). `python launch.py` and the older
`python -m eagle3.<module>` paths are shims that run the verb.
"""
