"""A tasks module that fails to import: the periodic checks (E066) name it (tests/streams_app/tasks/test_periodic.py)."""
raise RuntimeError("this module is broken on purpose")
