# SPDX-License-Identifier: MIT
"""script_checks.py -- what the torch-free tests of this folder's scripts
share: loading a script as a module, and checks that count their failures.

    from script_checks import Checks, load_script
    compare = load_script("compare.py")
    check = Checks("test_compare_summary")
    check(compare.median([1]) == 1, "median of one")
    check.finish()   # prints the verdict; exit status 1 if any check failed
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load_script(filename):
    """The script HERE/filename as a module, without running its main."""
    name = os.path.splitext(filename)[0]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Checks:
    def __init__(self, test_name):
        self.test_name = test_name
        self.failures = 0

    def __call__(self, cond, what):
        if not cond:
            self.failures += 1
            print("FAIL:", what)

    def finish(self):
        if self.failures:
            print("%s: %d failure(s)" % (self.test_name, self.failures))
            sys.exit(1)
        print("%s: all checks passed" % self.test_name)
        sys.exit(0)
