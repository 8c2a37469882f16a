"""Briefcase launcher package for Verbatim.

Briefcase runs the module named after the app (`verbatim`). The GUI lives in `app`, the engine
in `engine`; this package only starts the GUI (or, with `--self-check`, checks that a bundle or
a `briefcase dev` environment has everything the app imports). It is not installed by pip.
"""
