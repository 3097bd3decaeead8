"""A SEP-31 receiving anchor and a partner wallet, standing in for the anchor that pays
remittances out in India (DESIGN §6 reference plan ``remittance``, §7 ``/anchor31/``).

Modules: ``sep31`` (the API's rules), ``observer`` (watches the anchor's payments on the
sandbox Horizon), ``machine`` (status machine, faults, refunds on Stellar), ``world``
(hub, partner and anchor accounts), ``stellar`` (stellar-sdk over HTTP), ``views``.
"""
