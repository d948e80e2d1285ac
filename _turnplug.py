"""The ``turnplug`` console script's entry point, kept outside the three packages.

Importing `hooks.cli` loads the whole library (trio, httpx, attrs, cattrs, ...), which takes
a noticeable part of a second. The console script used to import it before any of our code
ran, so a Ctrl-C in that moment printed a ``KeyboardInterrupt`` traceback. This module imports
nothing, so the interrupt is caught around those imports too: the command exits 130,
silently, at any moment.
"""


def main() -> int:
    """Run the ``turnplug`` command (`hooks.cli.main`); 130 if interrupted, even at start-up."""
    try:
        from hooks.cli import main as turnplug

        return turnplug()
    except KeyboardInterrupt:
        return 130
