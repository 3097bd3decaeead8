"""What every Corridor app shares and none owns: the operator console's pieces
(``common.console``), the test-only crash points (``common.crashpoints``) and the one
PostgreSQL advisory-lock implementation (``common.locks``).

Not a Django app (no models, not in INSTALLED_APPS). It sits below every app
(DESIGN.md §2: ``sagas -> payouts -> anchor -> ledger``, all ``-> common``) and imports
nothing from anchor, payouts, sagas or ledger (tests/test_structure.py checks it)."""
