"""Horizon stand-in of the sandbox: a small Stellar network (ledgers closing on a timer,
accounts, trustlines, sequence numbers, signatures, the submission rules of
stellar-core and Horizon) served under ``/horizon/`` with Horizon's JSON shapes, so that
stellar-sdk's ``Server`` works against it unchanged.

- ``core``: envelope decoding, validity checks, applying transactions (XDR via
  ``stellar_sdk.xdr``);
- ``service``: ledger-close loop, submission queue, fixed world, friendbot, fault switches
  (``horizon.submit_504_after_apply``, ``horizon.submit_drop``,
  ``horizon.lookup_404_once``, and the lag faults ``horizon.lookup_lag``,
  ``horizon.ingest_behind``, ``horizon.split_nodes``: see its docstring);
- ``render`` / ``views`` / ``urls``: the HTTP surface (``views`` lists the endpoints).
"""
