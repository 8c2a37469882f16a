"""`python -m app [--model SPEC] [--data-dir DIR]`."""

from app.qt.main import main

raise SystemExit(main())
