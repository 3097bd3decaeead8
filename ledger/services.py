"""Ledger services: ``post`` / ``post_many`` (the only writers; ``post_with_cursor`` is
their SQL on any psycopg cursor), balances and the trial balance.

Rules and their sources (ledger-and-sagas.md):

- Idempotency (§1.1, §7 rule 6; TigerBeetle's client ids §2.4): ``idempotency_key`` is
  unique; posting a key again returns the existing entry and writes nothing; the same
  key with other lines raises ``IdempotencyConflict`` (Stripe-style parameter check).
- Locks (pgledger, §4.1): the accounts of an entry are locked ``FOR NO KEY UPDATE``
  (the balance update's own lock, which leaves foreign-key checks alone) sorted by
  id, so concurrent posts to the same accounts queue instead of deadlocking, and a
  precondition sees balances nobody else can change before this transaction ends.
- Preconditions (Modern Treasury, §4.1): ``precondition(balances)`` runs in the
  caller's transaction after the locks and before the first write; whatever it raises
  propagates and the transaction keeps nothing. The saga engine passes its fence check
  here; other callers pass balance checks (``require_balance``).
- Sum to zero per currency (hordak, §4.2): checked here before any SQL, and again by
  the deferred constraint trigger ``ledger_postings_balanced`` at commit, which also
  catches rows written without this module.
- Hot accounts (issue 11 §4; LEDGER_HOT_ACCOUNTS): accounts every saga books to are
  neither locked nor updated by a post; the balance trigger appends the postings' sum
  to ``ledger_balance_deltas`` and ``rollup`` folds the deltas into the balance
  (``SKIP LOCKED`` batches). A balance is the stored balance plus the unrolled deltas,
  read in one statement. This is Modern Treasury's split (recording entries may be
  asynchronous, authorizing ones are synchronous) with the balance kept as a summed
  log, as TigerBeetle and pgledger never allow a lock-free overdraft either:
- Non-negative accounts (LEDGER_NON_NEGATIVE_ACCOUNTS) are never hot: every post that
  touches one locks it (id order) and refuses with ``Overdraft`` a
  post that would leave it below zero (TigerBeetle's ``debits_must_not_exceed_credits``
  flag, pgledger's ``allow_negative_balance = false``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from fnmatch import fnmatchcase

from django.conf import settings
from django.db import connection, transaction

from ledger.models import Entry

PLACES = 7
QUANT = Decimal(1).scaleb(-PLACES)

AccountKey = tuple[str, str]  # (code, currency)
Balances = Mapping[AccountKey, Decimal]
Precondition = Callable[[Balances], None]


class LedgerError(Exception):
    """Base of the ledger's refusals. Nothing was written."""


class UnbalancedEntry(LedgerError):
    """The lines of an entry do not sum to zero in some currency."""


class InvalidAmount(LedgerError):
    """An amount is not a Decimal, is zero, or has more than 7 decimal places."""


class IdempotencyConflict(LedgerError):
    """The key was already posted with other lines (or another kind)."""


class PreconditionFailed(LedgerError):
    """A precondition (for example ``require_balance``) refused the post."""


class Overdraft(LedgerError):
    """The post would leave a non-negative account (LEDGER_NON_NEGATIVE_ACCOUNTS) below
    zero. ``account`` is the (code, currency), ``balance`` what it holds (before the
    post) and ``change`` the post's net amount on it."""

    def __init__(self, account: AccountKey, balance: Decimal, change: Decimal):
        super().__init__(f"{account[0]} holds {balance} {account[1]}; the post would "
                         f"move it by {change}")
        self.account, self.balance, self.change = account, balance, change


def _matches(code: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(code, pattern) for pattern in patterns)


def is_non_negative(code: str) -> bool:
    """Whether ``code`` matches LEDGER_NON_NEGATIVE_ACCOUNTS (fnmatch patterns)."""
    return _matches(code, settings.LEDGER_NON_NEGATIVE_ACCOUNTS)


def is_hot(code: str) -> bool:
    """Whether ``code`` matches LEDGER_HOT_ACCOUNTS and is not non-negative."""
    return _matches(code, settings.LEDGER_HOT_ACCOUNTS) and not is_non_negative(code)


@dataclass(frozen=True)
class Line:
    """One posting to be written: ``amount`` is signed, ``Decimal``, at most 7 dp, in
    the account's ``currency`` (``USDC``, ``INR``...). Accounts are created on first use."""

    account: str
    currency: str
    amount: Decimal

    @property
    def key(self) -> AccountKey:
        return (self.account, self.currency)


def lines_from(pairs: Iterable[tuple[str, str, Decimal]]) -> list[Line]:
    return [Line(account, currency, amount) for account, currency, amount in pairs]


# --- posting -------------------------------------------------------------------------

@dataclass(frozen=True)
class EntrySpec:
    """An entry to post: see ``post``."""

    idempotency_key: str
    kind: str
    lines: Sequence[Line]
    reference: str = ""
    saga_id: int | None = None


def post(*, idempotency_key: str, kind: str, lines: Sequence[Line], reference: str = "",
         saga_id: int | None = None, precondition: Precondition | None = None) -> Entry:
    """Write one entry and its postings in the caller's transaction (its own one when
    there is none) and return it.

    - ``lines``: at least two ``Line``s summing to zero per currency.
    - Same ``idempotency_key`` again with the same kind and lines: returns the existing
      entry (``entry.replayed`` is True), writes nothing and does not run
      ``precondition`` (the movement already happened).
    - ``precondition(balances)``: called once the accounts are locked, before the
      first write, with their balances (0 for accounts not opened yet). Hot accounts
      are not locked: their balance is read (one query, on first access) and may
      change before this transaction commits.

    Raises ``InvalidAmount``, ``UnbalancedEntry``, ``IdempotencyConflict``,
    ``Overdraft``, or whatever the precondition raises. Three round trips: lock the
    accounts (and look for the key), insert the entry, insert the postings."""
    spec = EntrySpec(idempotency_key, kind, lines, reference, saga_id)
    return post_many(entries=[spec], precondition=precondition)[0]


def post_many(*, entries: Sequence[EntrySpec],
              precondition: Precondition | None = None) -> list[Entry]:
    """``post`` for several entries in one transaction: the accounts of all of them are
    locked together in id order (so two callers never hold each other's accounts), the
    precondition runs once if any entry is new, and each key replays on its own.
    Returns the entries in the order given."""
    with transaction.atomic(savepoint=False), connection.cursor() as cur:
        posted = post_with_cursor(cur, entries=entries, precondition=precondition)
    out = []
    for p in posted:
        entry = Entry(id=p.entry_id, idempotency_key=p.idempotency_key, kind=p.kind,
                      reference=p.reference, saga_id=p.saga_id, created_at=p.created_at)
        entry._state.adding = False
        entry.replayed = p.replayed
        out.append(entry)
    return out


@dataclass(frozen=True)
class Posted:
    idempotency_key: str
    entry_id: int
    kind: str
    reference: str
    saga_id: int | None
    created_at: datetime
    replayed: bool


def post_with_cursor(cur, *, entries: Sequence[EntrySpec],
                     precondition: Precondition | None = None) -> list[Posted]:
    """The SQL of ``post_many`` on any DB-API cursor with ``%s`` parameters (Django's or
    a plain psycopg one), inside the transaction the caller holds open. The benchmark
    uses it to write the very same rows from DBOS transactions."""
    specs = [EntrySpec(s.idempotency_key, s.kind, _checked(s.lines), s.reference, s.saga_id)
             for s in entries]
    if len({s.idempotency_key for s in specs}) != len(specs):
        raise IdempotencyConflict("the same idempotency key twice in one post")
    keys = sorted({line.key for spec in specs for line in spec.lines})
    out: dict[str, Posted] = {}
    accounts, existing = _lock(cur, keys, [s.idempotency_key for s in specs])
    fresh = [s for s in specs if s.idempotency_key not in existing]
    for spec in specs:
        if spec.idempotency_key in existing:
            out[spec.idempotency_key] = _replay(cur, spec)
    if fresh:
        if precondition is not None:
            precondition(_Balances(cur, keys, accounts))
        _refuse_overdraft(fresh, accounts)
        missing = [key for key in keys if key not in accounts]
        if missing:
            cur.execute(
                "INSERT INTO ledger_accounts (code, currency, hot) VALUES "
                + ", ".join(["(%s, %s, %s)"] * len(missing))
                + " ON CONFLICT (code, currency) DO NOTHING",
                [part for key in missing for part in (*key, is_hot(key[0]))])
            more, _ = _lock(cur, missing, [])
            accounts.update(more)
            # An account another post opened meanwhile may hold money already.
            _refuse_overdraft(fresh, accounts)
        cur.execute(
            "INSERT INTO ledger_entries (idempotency_key, kind, reference, saga_id) "
            "VALUES " + ", ".join(["(%s, %s, %s, %s)"] * len(fresh))
            + " ON CONFLICT (idempotency_key) DO NOTHING "
            "RETURNING idempotency_key, id, created_at",
            [v for s in fresh for v in (s.idempotency_key, s.kind, s.reference, s.saga_id)])
        inserted = {key: (entry_id, at) for key, entry_id, at in cur.fetchall()}
        values = []
        for spec in fresh:
            if spec.idempotency_key not in inserted:
                # A concurrent post of the same key committed after our lock query.
                out[spec.idempotency_key] = _replay(cur, spec)
                continue
            entry_id, created_at = inserted[spec.idempotency_key]
            out[spec.idempotency_key] = Posted(spec.idempotency_key, entry_id, spec.kind,
                                               spec.reference, spec.saga_id, created_at,
                                               False)
            values += [v for line in spec.lines
                       for v in (entry_id, accounts[line.key][0], line.amount)]
        if values:
            cur.execute(
                "INSERT INTO ledger_postings (entry_id, account_id, amount) VALUES "
                + ", ".join(["(%s, %s, %s)"] * (len(values) // 3)), values)
    return [out[s.idempotency_key] for s in specs]


class _Balances(Mapping):
    """The balances a precondition sees: locked ones as read under the lock; a hot
    account's read (stored balance + unrolled deltas) only if the precondition asks."""

    def __init__(self, cur, keys: Sequence[AccountKey],
                 accounts: dict[AccountKey, tuple[int, Decimal | None]]):
        self._cur, self._keys, self._accounts = cur, list(keys), accounts

    def __getitem__(self, key: AccountKey) -> Decimal:
        if key not in self._keys:
            raise KeyError(key)
        if key not in self._accounts:
            return Decimal(0)
        account_id, amount = self._accounts[key]
        if amount is None:
            self._cur.execute(f"SELECT {_BALANCE} FROM ledger_accounts a WHERE a.id = %s",
                             [account_id])
            amount = self._cur.fetchone()[0]
            self._accounts[key] = (account_id, amount)
        return amount

    def __iter__(self) -> Iterator[AccountKey]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def _refuse_overdraft(specs: Sequence[EntrySpec],
                      accounts: Mapping[AccountKey, tuple[int, Decimal | None]]) -> None:
    net: dict[AccountKey, Decimal] = defaultdict(Decimal)
    for spec in specs:
        for line in spec.lines:
            net[line.key] += line.amount
    for key, change in sorted(net.items()):
        if change < 0 and is_non_negative(key[0]):
            held = accounts[key][1] if key in accounts else Decimal(0)
            if held + change < 0:
                raise Overdraft(key, held, change)


def require_balance(account: str, currency: str, at_least: Decimal) -> Precondition:
    """A precondition: ``account``'s balance (locked) must be >= ``at_least`` before the
    post. Raises ``PreconditionFailed``. Modern Treasury's balance filters (§4.1)."""
    def check(balances: Balances) -> None:
        have = balances.get((account, currency), Decimal(0))
        if have < at_least:
            raise PreconditionFailed(f"{account} holds {have} {currency}, needs {at_least}")
    return check


def _checked(lines: Sequence[Line]) -> list[Line]:
    if len(lines) < 2:
        raise UnbalancedEntry("an entry needs at least two lines")
    totals: dict[str, Decimal] = defaultdict(Decimal)
    out = []
    for line in lines:
        amount = line.amount
        if not isinstance(amount, Decimal) or not amount.is_finite():
            raise InvalidAmount(f"{line.account}: amount must be a finite Decimal, "
                                f"not {amount!r}")
        if amount == 0:
            raise InvalidAmount(f"{line.account}: zero amount")
        if amount != amount.quantize(QUANT):
            raise InvalidAmount(f"{line.account}: {amount} has more than {PLACES} decimals")
        totals[line.currency] += amount
        out.append(Line(line.account, line.currency, amount.quantize(QUANT)))
    unbalanced = {ccy: total for ccy, total in totals.items() if total != 0}
    if unbalanced:
        raise UnbalancedEntry(f"lines do not sum to zero: {unbalanced}")
    return out


# An account's balance in one statement: stored + unrolled deltas (alias ``a``).
_BALANCE = ("a.balance + COALESCE((SELECT SUM(d.amount) FROM ledger_balance_deltas d "
            "WHERE d.account_id = a.id), 0)")


def _lock(cur, keys: Sequence[AccountKey], idempotency_keys: Sequence[str]):
    """One round trip: lock the existing accounts among ``keys`` that must be locked
    (all but the hot ones) ``FOR NO KEY UPDATE`` in id order and read their balances; find
    the hot ones' ids (no lock, no balance); and find which of ``idempotency_keys``
    were posted already. Returns ({key: (id, balance or None)}, posted keys).

    With LEDGER_LOCK_NON_NEGATIVE off (tests only) non-negative accounts are read
    without a lock."""
    lock, read, plain = [], [], []
    for key in keys:
        if is_non_negative(key[0]):
            (lock if settings.LEDGER_LOCK_NON_NEGATIVE else read).append(key)
        else:
            (plain if is_hot(key[0]) else lock).append(key)
    parts, params = [], []

    def where(group: Sequence[AccountKey]) -> str:
        params.extend(part for key in group for part in key)
        return "(a.code, a.currency) IN (" + ", ".join(["(%s, %s)"] * len(group)) + ")"

    if lock:
        parts.append("SELECT l.id, l.code, l.currency, l.balance, NULL::text[] FROM "
                     f"(SELECT a.id, a.code, a.currency, {_BALANCE} AS balance "
                     f"FROM ledger_accounts a WHERE {where(lock)} "
                     "ORDER BY a.id FOR NO KEY UPDATE OF a) l")
    if read:
        parts.append(f"SELECT a.id, a.code, a.currency, {_BALANCE}, NULL::text[] "
                     f"FROM ledger_accounts a WHERE {where(read)}")
    if plain:
        parts.append("SELECT a.id, a.code, a.currency, NULL::numeric, NULL::text[] "
                     f"FROM ledger_accounts a WHERE {where(plain)}")
    if idempotency_keys:
        parts.append("SELECT NULL, NULL, NULL, NULL, ARRAY(SELECT e.idempotency_key "
                     "FROM ledger_entries e WHERE e.idempotency_key = ANY(%s::text[]))")
        params.append(list(idempotency_keys))
    cur.execute(" UNION ALL ".join(f"({part})" for part in parts), params)
    accounts: dict[AccountKey, tuple[int, Decimal | None]] = {}
    existing: set[str] = set()
    for account_id, code, currency, amount, posted in cur.fetchall():
        if account_id is None:
            existing = set(posted)
        else:
            accounts[(code, currency)] = (account_id, amount)
    return accounts, existing


def _replay(cur, spec: EntrySpec) -> Posted:
    cur.execute(
        "SELECT e.id, e.kind, e.reference, e.saga_id, e.created_at, a.code, a.currency, "
        "p.amount FROM ledger_entries e "
        "LEFT JOIN ledger_postings p ON p.entry_id = e.id "
        "LEFT JOIN ledger_accounts a ON a.id = p.account_id "
        "WHERE e.idempotency_key = %s", [spec.idempotency_key])
    rows = cur.fetchall()
    entry_id, kind, reference, saga_id, created_at = rows[0][:5]
    stored = Counter((code, ccy, amount.quantize(QUANT))
                     for *_, code, ccy, amount in rows if amount is not None)
    asked = Counter((line.account, line.currency, line.amount) for line in spec.lines)
    if kind != spec.kind or stored != asked:
        raise IdempotencyConflict(
            f"{spec.idempotency_key} was posted as {kind} {sorted(stored.elements())},"
            f" now asked as {spec.kind} {sorted(asked.elements())}")
    return Posted(spec.idempotency_key, entry_id, kind, reference, saga_id, created_at, True)


# --- reading -------------------------------------------------------------------------

def balance(*, account: str, currency: str) -> Decimal:
    """The balance of one account: stored balance + unrolled deltas, in one statement
    (0 if it was never used)."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT {_BALANCE} FROM ledger_accounts a "
                    "WHERE a.code = %s AND a.currency = %s", [account, currency])
        row = cur.fetchone()
    return row[0] if row else Decimal(0)


def balances(*, prefix: str = "", currency: str | None = None) -> dict[AccountKey, Decimal]:
    """Balances of the accounts whose code starts with ``prefix`` (all by default)."""
    sql = f"SELECT a.code, a.currency, {_BALANCE} FROM ledger_accounts a WHERE a.code LIKE %s"
    params: list = [prefix.replace("%", r"\%").replace("_", r"\_") + "%"]
    if currency is not None:
        sql += " AND a.currency = %s"
        params.append(currency)
    with connection.cursor() as cur:
        cur.execute(sql + " ORDER BY a.code, a.currency", params)
        return {(code, ccy): amount for code, ccy, amount in cur.fetchall()}


@dataclass
class TrialBalance:
    """What operators and tests read (DESIGN.md §8 invariant 3).

    - ``totals``: per currency, the sum of all account balances (must be 0);
    - ``accounts``: (code, currency) -> balance (stored + unrolled deltas);
    - ``drift``: accounts whose balance differs from the sum of their postings;
    - ``unbalanced``: (entry id, currency, sum) of entries that do not sum to zero."""

    totals: dict[str, Decimal] = field(default_factory=dict)
    accounts: dict[AccountKey, Decimal] = field(default_factory=dict)
    drift: list[tuple[str, str, Decimal, Decimal]] = field(default_factory=list)
    unbalanced: list[tuple[int, str, Decimal]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (all(total == 0 for total in self.totals.values())
                and not self.drift and not self.unbalanced)


def trial_balance() -> TrialBalance:
    """Read the whole ledger in one snapshot (REPEATABLE READ, read only)."""
    result = TrialBalance()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cur.execute(
            f"SELECT a.code, a.currency, {_BALANCE}, COALESCE(SUM(p.amount), 0) "
            "FROM ledger_accounts a LEFT JOIN ledger_postings p ON p.account_id = a.id "
            "GROUP BY a.id ORDER BY a.code, a.currency")
        for code, ccy, stored, summed in cur.fetchall():
            result.accounts[(code, ccy)] = stored
            result.totals[ccy] = result.totals.get(ccy, Decimal(0)) + stored
            if stored != summed:
                result.drift.append((code, ccy, stored, summed))
        cur.execute(
            "SELECT p.entry_id, a.currency, SUM(p.amount) FROM ledger_postings p "
            "JOIN ledger_accounts a ON a.id = p.account_id "
            "GROUP BY p.entry_id, a.currency HAVING SUM(p.amount) <> 0 ORDER BY 1")
        result.unbalanced = [tuple(row) for row in cur.fetchall()]
    return result


# --- hot accounts ----------------------------------------------------------------------

def rollup(*, batch: int | None = None) -> int:
    """Fold at most ``batch`` (default LEDGER_ROLLUP_BATCH) unrolled deltas, oldest
    first, into their accounts' balances, in one transaction; return how many.

    Safe to run concurrently and beside posts: the deltas are claimed ``FOR UPDATE
    SKIP LOCKED`` (two rollups take disjoint batches), their accounts are locked in id
    order (like a post) before the update, and deleting the deltas and adding their
    sum happen in one commit, so every reader's snapshot sees each amount exactly once
    (in the balance or in a delta)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(*rollup_claim_sql(batch=batch))
        rows = cur.fetchall()
        if not rows:
            return 0
        totals: dict[int, Decimal] = defaultdict(Decimal)
        for _, account_id, amount in rows:
            totals[account_id] += amount
        ids = sorted(totals)
        # NO KEY UPDATE: what the UPDATE takes anyway; it leaves posts' foreign-key
        # checks (FOR KEY SHARE) alone, so a rollup never deadlocks with a commit.
        cur.execute("SELECT id FROM ledger_accounts WHERE id = ANY(%s) ORDER BY id "
                    "FOR NO KEY UPDATE", [ids])
        cur.execute(
            "WITH gone AS (DELETE FROM ledger_balance_deltas WHERE id = ANY(%s)) "
            "UPDATE ledger_accounts a SET balance = a.balance + v.total::numeric "
            "FROM (SELECT unnest(%s::bigint[]) AS id, unnest(%s::numeric[]) AS total) v "
            "WHERE a.id = v.id",
            [[row[0] for row in rows], ids, [totals[i] for i in ids]])
    return len(rows)


def rollup_claim_sql(*, batch: int | None = None) -> tuple[str, list]:
    """(sql, params) of ``rollup``'s claim of the oldest deltas (corridor/periodic.py
    explains it): a queue table, folded rows are deleted, read by its primary key."""
    batch = settings.LEDGER_ROLLUP_BATCH if batch is None else batch
    claim = " FOR UPDATE SKIP LOCKED" if settings.LEDGER_ROLLUP_SKIP_LOCKED else ""
    return ("SELECT id, account_id, amount FROM ledger_balance_deltas ORDER BY id "
            "LIMIT %s" + claim, [batch])


def sync_hot_flags() -> int:
    """Set each account's ``hot`` flag from LEDGER_HOT_ACCOUNTS and
    LEDGER_NON_NEGATIVE_ACCOUNTS (after a change of either); return how many changed.
    Safe at any time: a balance read counts the deltas whatever the flag. Run
    ``rollup`` afterwards so no non-negative account keeps unrolled deltas."""
    with connection.cursor() as cur:
        cur.execute("SELECT id, code, hot FROM ledger_accounts")
        flips = [(account_id, not hot) for account_id, code, hot in cur.fetchall()
                 if is_hot(code) != hot]
        for account_id, hot in flips:
            cur.execute("UPDATE ledger_accounts SET hot = %s WHERE id = %s", [hot, account_id])
    return len(flips)
