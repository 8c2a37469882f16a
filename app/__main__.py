"""`python -m app [--model SPEC] [--data-dir DIR]`."""

from .main import main

raise SystemExit(main())
