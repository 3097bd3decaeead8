"""A small stellar-core for the Horizon stand-in: envelope decoding, the validity
checks a submission goes through, and applying transactions at ledger close.

Everything on the wire is built and read with stellar-sdk's XDR classes
(``stellar_sdk.xdr``): envelopes are decoded with ``TransactionEnvelope``, results are
``TransactionResult``, metas ``TransactionMeta`` v3, ledger headers ``LedgerHeader``.

Rules and their sources (stellar-core ``src/transactions/TransactionFrame.cpp``,
``OperationFrame.cpp``, ``PaymentOpFrame.cpp``, ``CreateAccountOpFrame.cpp``,
``ChangeTrustOpFrame.cpp``; horizon/NOTES.md §2.1):

- check order (``commonValidPreSeqNum`` then ``commonValid``): operation count
  (``tx_missing_operation``), time bounds and ledger bounds (``tx_too_early`` /
  ``tx_too_late``; ``max_ledger`` exclusive), inclusion fee >= base fee x operations
  (``tx_insufficient_fee``), source account exists (``tx_no_source_account``),
  sequence = account sequence + 1 or the min-sequence precondition
  (``tx_bad_seq``), min sequence age / ledger gap, signature of the source account
  (``tx_bad_auth``), fee within the available XLM (``tx_insufficient_balance``);
  then each operation (its source's signature -> ``op_bad_auth``, static validity ->
  ``op_malformed``; any failure -> ``tx_failed``), then every signature used
  (``tx_bad_auth_extra``);
- signatures: each account is signed for by its master key (weight 1, thresholds 0;
  core needs a weight strictly above the threshold, so one valid ed25519 signature over
  the transaction hash whose hint matches the key);
- a result produced by validation charges nothing and carries ``fee_charged`` = the
  fee bid, except ``tx_bad_seq``, which answers Horizon's canned result
  ``AAAAAAAAAAD////7AAAAAA==`` (fee 0; stellar/go txsub ``ErrBadSequence``);
- applying: the fee (base fee x operations: there is no surge pricing here) is
  charged and the sequence consumed even when an operation fails (``tx_failed``);
  the operations' changes are then rolled back;
- supported operations: ``create_account``, ``payment`` (native and credit assets; the
  issuer mints and burns without a trustline; checks in core's order: destination
  exists -> ``op_no_destination``, destination trustline -> ``op_no_trust``, limit ->
  ``op_line_full``, source trustline -> ``op_src_no_trust``, balance ->
  ``op_underfunded``), ``change_trust`` (add, change limit, remove). Any other operation
  is refused at submission with ``op_not_supported``; fee-bump envelopes and extra
  signers with ``tx_not_supported`` (sandbox limitations).

Reserves: minimum balance = (2 + subentries) x 0.5 XLM (base reserve 5,000,000 stroops).
Amounts are ``Decimal`` XLM / asset units with 7 decimal places; fees are stroops.
"""

from __future__ import annotations

import base64
import codecs
import copy
import hashlib
from dataclasses import dataclass, field
from decimal import Decimal

from stellar_sdk import Asset, Keypair, MuxedAccount, StrKey, xdr
from stellar_sdk.exceptions import BadSignatureError

from common import devkeys
from sandbox.horizon import models

DB = "sandbox"

PROTOCOL_VERSION = 21
BASE_FEE = 100  # stroops per operation (ledger header baseFee)
BASE_RESERVE_STROOPS = 5_000_000
MAX_TX_SET_SIZE = 1000  # operations
MAX_OPERATIONS = 100  # per transaction (MAX_OPS_PER_TX)
QUEUE_DEPTH = 4  # ledgers a not-yet-valid transaction may wait in the queue
STROOP = Decimal("0.0000001")
BASE_RESERVE = Decimal(BASE_RESERVE_STROOPS) * STROOP
MAX_AMOUNT = Decimal("922337203685.4775807")  # INT64_MAX stroops
TOTAL_COINS = Decimal("100000000000.0000000")
CANNED_BAD_SEQ_RESULT = "AAAAAAAAAAD////7AAAAAA=="

TRUSTLINE_AUTHORIZED = 1

TX = xdr.TransactionResultCode
OPS = xdr.OperationType

TX_CODE_NAMES = {
    TX.txSUCCESS: "tx_success",
    TX.txFAILED: "tx_failed",
    TX.txTOO_EARLY: "tx_too_early",
    TX.txTOO_LATE: "tx_too_late",
    TX.txMISSING_OPERATION: "tx_missing_operation",
    TX.txBAD_SEQ: "tx_bad_seq",
    TX.txBAD_AUTH: "tx_bad_auth",
    TX.txINSUFFICIENT_BALANCE: "tx_insufficient_balance",
    TX.txNO_ACCOUNT: "tx_no_source_account",
    TX.txINSUFFICIENT_FEE: "tx_insufficient_fee",
    TX.txBAD_AUTH_EXTRA: "tx_bad_auth_extra",
    TX.txINTERNAL_ERROR: "tx_internal_error",
    TX.txNOT_SUPPORTED: "tx_not_supported",
    TX.txFEE_BUMP_INNER_FAILED: "tx_fee_bump_inner_failed",
    TX.txBAD_SPONSORSHIP: "tx_bad_sponsorship",
    TX.txBAD_MIN_SEQ_AGE_OR_GAP: "tx_bad_minseq_age_or_gap",
    TX.txMALFORMED: "tx_malformed",
}
# Horizon's strings (stellar/go services/horizon/internal/codes/main.go).
OUTER_OP_CODE_NAMES = {
    xdr.OperationResultCode.opBAD_AUTH: "op_bad_auth",
    xdr.OperationResultCode.opNO_ACCOUNT: "op_no_source_account",
    xdr.OperationResultCode.opNOT_SUPPORTED: "op_not_supported",
    xdr.OperationResultCode.opTOO_MANY_SUBENTRIES: "op_too_many_subentries",
    xdr.OperationResultCode.opEXCEEDED_WORK_LIMIT: "op_exceeded_work_limit",
    xdr.OperationResultCode.opTOO_MANY_SPONSORING: "op_too_many_sponsoring",
}
_CA = xdr.CreateAccountResultCode
_PAY = xdr.PaymentResultCode
_CT = xdr.ChangeTrustResultCode
# Keyed by operation type: the result-code enums share integer values.
INNER_OP_CODE_NAMES = {
    OPS.CREATE_ACCOUNT: {
        _CA.CREATE_ACCOUNT_SUCCESS: "op_success",
        _CA.CREATE_ACCOUNT_MALFORMED: "op_malformed",
        _CA.CREATE_ACCOUNT_UNDERFUNDED: "op_underfunded",
        _CA.CREATE_ACCOUNT_LOW_RESERVE: "op_low_reserve",
        _CA.CREATE_ACCOUNT_ALREADY_EXIST: "op_already_exists",
    },
    OPS.PAYMENT: {
        _PAY.PAYMENT_SUCCESS: "op_success",
        _PAY.PAYMENT_MALFORMED: "op_malformed",
        _PAY.PAYMENT_UNDERFUNDED: "op_underfunded",
        _PAY.PAYMENT_SRC_NO_TRUST: "op_src_no_trust",
        _PAY.PAYMENT_SRC_NOT_AUTHORIZED: "op_src_not_authorized",
        _PAY.PAYMENT_NO_DESTINATION: "op_no_destination",
        _PAY.PAYMENT_NO_TRUST: "op_no_trust",
        _PAY.PAYMENT_NOT_AUTHORIZED: "op_not_authorized",
        _PAY.PAYMENT_LINE_FULL: "op_line_full",
        _PAY.PAYMENT_NO_ISSUER: "op_no_issuer",
    },
    OPS.CHANGE_TRUST: {
        _CT.CHANGE_TRUST_SUCCESS: "op_success",
        _CT.CHANGE_TRUST_MALFORMED: "op_malformed",
        _CT.CHANGE_TRUST_NO_ISSUER: "op_no_issuer",
        _CT.CHANGE_TRUST_INVALID_LIMIT: "op_invalid_limit",
        _CT.CHANGE_TRUST_LOW_RESERVE: "op_low_reserve",
        _CT.CHANGE_TRUST_SELF_NOT_ALLOWED: "op_self_not_allowed",
    },
}
OP_TYPE_NAMES = {
    OPS.CREATE_ACCOUNT: "create_account",
    OPS.PAYMENT: "payment",
    OPS.PATH_PAYMENT_STRICT_RECEIVE: "path_payment_strict_receive",
    OPS.MANAGE_SELL_OFFER: "manage_sell_offer",
    OPS.CREATE_PASSIVE_SELL_OFFER: "create_passive_sell_offer",
    OPS.SET_OPTIONS: "set_options",
    OPS.CHANGE_TRUST: "change_trust",
    OPS.ALLOW_TRUST: "allow_trust",
    OPS.ACCOUNT_MERGE: "account_merge",
    OPS.INFLATION: "inflation",
    OPS.MANAGE_DATA: "manage_data",
    OPS.BUMP_SEQUENCE: "bump_sequence",
    OPS.MANAGE_BUY_OFFER: "manage_buy_offer",
    OPS.PATH_PAYMENT_STRICT_SEND: "path_payment_strict_send",
}
SUPPORTED_OPS = {OPS.CREATE_ACCOUNT, OPS.PAYMENT, OPS.CHANGE_TRUST}
# Operations Horizon lists under /payments (stellar/go history/operation.go OnlyPayments).
PAYMENT_OP_TYPES = {OPS.CREATE_ACCOUNT, OPS.PAYMENT, OPS.PATH_PAYMENT_STRICT_RECEIVE,
                    OPS.PATH_PAYMENT_STRICT_SEND, OPS.ACCOUNT_MERGE}


# --- amounts ---------------------------------------------------------------------

def amount_from_stroops(stroops: int) -> Decimal:
    """int64 stroops -> Decimal units with 7 decimal places (exact)."""
    return (Decimal(stroops) * STROOP).quantize(STROOP)


def to_stroops(amount: Decimal) -> int:
    """Decimal units (at most 7 decimal places) -> int64 stroops. Raises ValueError if
    the amount has more precision than a stroop."""
    quantized = amount.quantize(STROOP)
    if quantized != amount:
        raise ValueError(f"{amount} has more than 7 decimal places")
    return int(quantized.scaleb(7))


def format_amount(amount: Decimal) -> str:
    """Horizon's amount string: always 7 decimals ("10000.0000000")."""
    return format(amount.quantize(STROOP), "f")


def parse_amount(text: str) -> Decimal:
    """A positive amount string with at most 7 decimals (as stellar-sdk's
    ``raise_if_not_valid_amount``, counting digits on the literal). Raises ValueError."""
    value = Decimal(str(text))
    if not value.is_finite() or value <= 0 or value > MAX_AMOUNT:
        raise ValueError(f"amount {text!r} is not in (0, {MAX_AMOUNT}]")
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -7:
        raise ValueError(f"amount {text!r} has more than 7 decimal places")
    return value.quantize(STROOP)


# --- text and keys ---------------------------------------------------------------

def _scrub_one_byte(error: UnicodeDecodeError):
    return "\ufffd", error.start + 1


codecs.register_error("sandbox_horizon_scrub", _scrub_one_byte)


def memo_text_for_horizon(raw: bytes) -> str:
    """Horizon's rendering of a text memo: invalid UTF-8 bytes each replaced by U+FFFD
    (Go's ``utf8.DecodeRune`` consumes one byte per error) and NUL bytes removed
    (stellar/go ``transaction_batch_insert_builder.go``, ``utf8.Scrub``)."""
    return raw.decode("utf-8", errors="sandbox_horizon_scrub").replace("\x00", "")


def address_of(account_id: xdr.AccountID) -> str:
    """An XDR AccountID -> its G... address."""
    return StrKey.encode_ed25519_public_key(account_id.account_id.ed25519.uint256)


def muxed_parts(muxed: xdr.MuxedAccount) -> tuple[str, str | None, int | None]:
    """An XDR MuxedAccount -> (G... address, M... address or None, muxed id or None)."""
    if muxed.type == xdr.CryptoKeyType.KEY_TYPE_MUXED_ED25519:
        account = StrKey.encode_ed25519_public_key(muxed.med25519.ed25519.uint256)
        muxed_id = muxed.med25519.id.uint64
        return account, MuxedAccount(account, muxed_id).account_muxed, muxed_id
    return StrKey.encode_ed25519_public_key(muxed.ed25519.uint256), None, None


def xdr_account_id(address: str) -> xdr.AccountID:
    """A G... address -> its XDR AccountID."""
    return Keypair.from_public_key(address).xdr_account_id()


def network_id(passphrase: str) -> bytes:
    """sha256 of the network passphrase (the network id that transaction hashes include)."""
    return hashlib.sha256(passphrase.encode()).digest()


def root_keypair(passphrase: str) -> Keypair:
    """The network's root account: seed = sha256(passphrase), as on every Stellar
    network (stellar-core ``SecretKey::fromSeed(networkID)``; common/devkeys.py, whose
    seeds production refuses)."""
    return devkeys.network_root_keypair(passphrase)


# --- assets ----------------------------------------------------------------------

@dataclass(frozen=True)
class AssetKey:
    """A credit asset (code, issuer) or native (code None)."""

    code: str | None = None
    issuer: str | None = None

    @property
    def native(self) -> bool:
        return self.code is None

    @property
    def asset_type(self) -> str:
        if self.native:
            return "native"
        return "credit_alphanum4" if len(self.code) <= 4 else "credit_alphanum12"

    def horizon_fields(self) -> dict:
        if self.native:
            return {"asset_type": "native"}
        return {"asset_type": self.asset_type, "asset_code": self.code,
                "asset_issuer": self.issuer}

    def sdk(self) -> Asset:
        return Asset.native() if self.native else Asset(self.code, self.issuer)


class InvalidAsset(ValueError):
    """An asset core calls malformed (``op_malformed``) or a pool share (unsupported)."""
    pass


def _asset_code(raw: bytes, low: int, high: int) -> str:
    code = raw.rstrip(b"\x00")
    if not low <= len(code) <= high or b"\x00" in code:
        raise InvalidAsset(f"bad asset code {raw!r}")
    text = code.decode("ascii", errors="replace")
    if not text.isascii() or not text.isalnum():
        raise InvalidAsset(f"bad asset code {raw!r}")
    return text


def asset_from_xdr(asset: xdr.Asset | xdr.ChangeTrustAsset) -> AssetKey:
    """Raises InvalidAsset for codes core calls malformed (``isAssetValid``) and for
    pool shares (not supported)."""
    if asset.type == xdr.AssetType.ASSET_TYPE_NATIVE:
        return AssetKey()
    if asset.type == xdr.AssetType.ASSET_TYPE_CREDIT_ALPHANUM4:
        return AssetKey(_asset_code(asset.alpha_num4.asset_code.asset_code4, 1, 4),
                        address_of(asset.alpha_num4.issuer))
    if asset.type == xdr.AssetType.ASSET_TYPE_CREDIT_ALPHANUM12:
        return AssetKey(_asset_code(asset.alpha_num12.asset_code.asset_code12, 5, 12),
                        address_of(asset.alpha_num12.issuer))
    raise InvalidAsset("liquidity pool shares are not supported")


# --- envelopes -------------------------------------------------------------------

class MalformedEnvelope(ValueError):
    """The ``tx`` field is not a base64 XDR TransactionEnvelope (Horizon:
    ``transaction_malformed``)."""


@dataclass
class ParsedOp:
    """One operation of an envelope: type, explicit source (if any) and the XDR body."""

    index: int  # 1-based
    type: xdr.OperationType
    source: str | None  # explicit source, G...
    source_muxed: str | None
    source_muxed_id: int | None
    body: xdr.OperationBody

    @property
    def type_name(self) -> str:
        return OP_TYPE_NAMES.get(self.type, self.type.name.lower())


@dataclass
class Envelope:
    """A decoded envelope: its hash (hex, over network id + tagged transaction, the same
    for every resubmission) and the transaction's fields in plain Python."""

    raw: str
    hash: str
    fee_bump: bool
    signatures: list[xdr.DecoratedSignature]
    source: str
    source_muxed: str | None
    source_muxed_id: int | None
    sequence: int
    fee: int
    memo: xdr.Memo
    time_bounds: tuple[int, int] | None
    ledger_bounds: tuple[int, int] | None
    min_seq_num: int | None
    min_seq_age: int
    min_seq_ledger_gap: int
    extra_signers: int
    ops: list[ParsedOp] = field(default_factory=list)

    def op_source(self, op: ParsedOp) -> tuple[str, str | None, int | None]:
        if op.source is not None:
            return op.source, op.source_muxed, op.source_muxed_id
        return self.source, self.source_muxed, self.source_muxed_id

    @property
    def hash_bytes(self) -> bytes:
        return bytes.fromhex(self.hash)


def parse_envelope(raw: str, passphrase: str) -> Envelope:
    """Decode a base64 TransactionEnvelope (v0, v1 or fee bump) and hash it with the
    network passphrase (stellar-core ``getContentsHash``: sha256 of network id,
    ENVELOPE_TYPE_TX and the v1 transaction; a v0 transaction hashes as its v1 form).
    Raises MalformedEnvelope."""
    try:
        data = base64.b64decode(raw.strip(), validate=True)
        envelope = xdr.TransactionEnvelope.from_xdr_bytes(data)
    except Exception as exc:  # any decoding failure is "malformed" to Horizon
        raise MalformedEnvelope(str(exc)) from exc
    nid = xdr.Hash(network_id(passphrase))
    if envelope.type == xdr.EnvelopeType.ENVELOPE_TYPE_TX_FEE_BUMP:
        fee_bump = envelope.fee_bump.tx
        payload = xdr.TransactionSignaturePayload(
            nid, xdr.TransactionSignaturePayloadTaggedTransaction(
                xdr.EnvelopeType.ENVELOPE_TYPE_TX_FEE_BUMP, fee_bump=fee_bump))
        tx = fee_bump.inner_tx.v1.tx
        signatures = envelope.fee_bump.signatures
        is_fee_bump = True
    else:
        if envelope.type == xdr.EnvelopeType.ENVELOPE_TYPE_TX_V0:
            v0 = envelope.v0.tx
            cond = (xdr.Preconditions(xdr.PreconditionType.PRECOND_TIME,
                                      time_bounds=v0.time_bounds)
                    if v0.time_bounds else xdr.Preconditions(xdr.PreconditionType.PRECOND_NONE))
            tx = xdr.Transaction(
                source_account=xdr.MuxedAccount(xdr.CryptoKeyType.KEY_TYPE_ED25519,
                                                ed25519=v0.source_account_ed25519),
                fee=v0.fee, seq_num=v0.seq_num, cond=cond, memo=v0.memo,
                operations=v0.operations, ext=xdr.TransactionExt(0))
            signatures = envelope.v0.signatures
        else:
            tx = envelope.v1.tx
            signatures = envelope.v1.signatures
        payload = xdr.TransactionSignaturePayload(
            nid, xdr.TransactionSignaturePayloadTaggedTransaction(
                xdr.EnvelopeType.ENVELOPE_TYPE_TX, tx=tx))
        is_fee_bump = False
    tx_hash = hashlib.sha256(payload.to_xdr_bytes()).hexdigest()

    source, source_muxed, source_muxed_id = muxed_parts(tx.source_account)
    time_bounds = ledger_bounds = None
    min_seq_num = None
    min_seq_age = min_seq_gap = extra = 0
    cond = tx.cond
    if cond.type == xdr.PreconditionType.PRECOND_TIME:
        tb = cond.time_bounds
        time_bounds = (tb.min_time.time_point.uint64, tb.max_time.time_point.uint64)
    elif cond.type == xdr.PreconditionType.PRECOND_V2:
        v2 = cond.v2
        if v2.time_bounds:
            time_bounds = (v2.time_bounds.min_time.time_point.uint64,
                           v2.time_bounds.max_time.time_point.uint64)
        if v2.ledger_bounds:
            ledger_bounds = (v2.ledger_bounds.min_ledger.uint32,
                             v2.ledger_bounds.max_ledger.uint32)
        if v2.min_seq_num is not None:
            min_seq_num = v2.min_seq_num.sequence_number.int64
        min_seq_age = v2.min_seq_age.duration.uint64
        min_seq_gap = v2.min_seq_ledger_gap.uint32
        extra = len(v2.extra_signers)
    ops = []
    for index, op in enumerate(tx.operations, start=1):
        op_source = muxed_parts(op.source_account) if op.source_account else (None, None, None)
        ops.append(ParsedOp(index, op.body.type, *op_source, body=op.body))
    return Envelope(
        raw=raw.strip(), hash=tx_hash, fee_bump=is_fee_bump, signatures=list(signatures),
        source=source, source_muxed=source_muxed, source_muxed_id=source_muxed_id,
        sequence=tx.seq_num.sequence_number.int64, fee=tx.fee.uint32, memo=tx.memo,
        time_bounds=time_bounds, ledger_bounds=ledger_bounds, min_seq_num=min_seq_num,
        min_seq_age=min_seq_age, min_seq_ledger_gap=min_seq_gap, extra_signers=extra, ops=ops,
    )


# --- results ---------------------------------------------------------------------

def op_inner_result(op_type: xdr.OperationType, code) -> xdr.OperationResult:
    """An ``opINNER`` result of one of the supported operation types."""
    if op_type == OPS.CREATE_ACCOUNT:
        tr = xdr.OperationResultTr(op_type, create_account_result=xdr.CreateAccountResult(code))
    elif op_type == OPS.PAYMENT:
        tr = xdr.OperationResultTr(op_type, payment_result=xdr.PaymentResult(code))
    elif op_type == OPS.CHANGE_TRUST:
        tr = xdr.OperationResultTr(op_type, change_trust_result=xdr.ChangeTrustResult(code))
    else:
        raise ValueError(f"no inner result for {op_type}")
    return xdr.OperationResult(xdr.OperationResultCode.opINNER, tr)


def op_outer_result(code: xdr.OperationResultCode) -> xdr.OperationResult:
    """A result without an inner part (``op_bad_auth``, ``op_no_source_account``,
    ``op_not_supported``)."""
    return xdr.OperationResult(code)


_SUCCESS_CODES = {
    OPS.CREATE_ACCOUNT: _CA.CREATE_ACCOUNT_SUCCESS,
    OPS.PAYMENT: _PAY.PAYMENT_SUCCESS,
    OPS.CHANGE_TRUST: _CT.CHANGE_TRUST_SUCCESS,
}


def op_success(op_type: xdr.OperationType) -> xdr.OperationResult:
    """The success result of a supported operation type."""
    return op_inner_result(op_type, _SUCCESS_CODES[op_type])


def op_result_ok(result: xdr.OperationResult) -> bool:
    """Whether an operation result is a success."""
    return op_code_name(result) == "op_success"


def op_code_name(result: xdr.OperationResult) -> str:
    """Horizon's string for one operation result (``op_success``, ``op_no_trust``...)."""
    if result.code != xdr.OperationResultCode.opINNER:
        return OUTER_OP_CODE_NAMES.get(result.code, "op_unknown")
    tr = result.tr
    inner = {
        OPS.CREATE_ACCOUNT: tr.create_account_result,
        OPS.PAYMENT: tr.payment_result,
        OPS.CHANGE_TRUST: tr.change_trust_result,
    }.get(tr.type)
    if inner is None:
        return "op_unknown"
    return INNER_OP_CODE_NAMES[tr.type].get(inner.code, "op_unknown")


@dataclass
class TxResult:
    """A TransactionResult: ``code`` (xdr.TransactionResultCode), ``fee_charged``
    (stroops), ``op_results`` for txSUCCESS / txFAILED."""

    code: xdr.TransactionResultCode
    fee_charged: int
    op_results: list[xdr.OperationResult] | None = None
    canned_xdr: str | None = None

    @property
    def successful(self) -> bool:
        return self.code == TX.txSUCCESS

    def to_xdr(self) -> str:
        if self.canned_xdr:
            return self.canned_xdr
        has_ops = self.code in (TX.txSUCCESS, TX.txFAILED)
        result = xdr.TransactionResult(
            fee_charged=xdr.Int64(self.fee_charged),
            result=xdr.TransactionResultResult(
                self.code, results=(self.op_results or []) if has_ops else None),
            ext=xdr.TransactionResultExt(0),
        )
        return result.to_xdr()


def result_codes(result_xdr: str) -> dict:
    """Horizon's ``extras.result_codes`` for a TransactionResult (``transaction``, and
    ``operations`` when the result carries operation results)."""
    result = xdr.TransactionResult.from_xdr(result_xdr)
    codes = {"transaction": TX_CODE_NAMES.get(result.result.code, "tx_unknown")}
    if result.result.code in (TX.txSUCCESS, TX.txFAILED) and result.result.results:
        codes["operations"] = [op_code_name(r) for r in result.result.results]
    return codes


def bad_seq_result() -> TxResult:
    """``tx_bad_seq`` as Horizon answers it: its canned result XDR with fee 0."""
    return TxResult(TX.txBAD_SEQ, 0, canned_xdr=CANNED_BAD_SEQ_RESULT)


# --- ledger state ----------------------------------------------------------------

@dataclass
class AccountEntry:
    """An account ledger entry in memory: balance in XLM (Decimal, 7 dp), sequence, subentries,
    thresholds (master key only), ``sequence_ledger`` / ``sequence_time`` of the last sequence
    bump."""

    account_id: str
    balance: Decimal
    sequence: int
    subentry_count: int = 0
    flags: int = 0
    home_domain: str = ""
    master_weight: int = 1
    low_threshold: int = 0
    med_threshold: int = 0
    high_threshold: int = 0
    data: dict = field(default_factory=dict)
    sequence_ledger: int | None = None
    sequence_time: int | None = None
    last_modified_ledger: int = 0
    last_modified_time: int = 0

    def min_balance(self) -> Decimal:
        """(2 + subentries) x base reserve (stellar-core ``getMinBalance``)."""
        return (2 + self.subentry_count) * BASE_RESERVE

    def available(self) -> Decimal:
        return self.balance - self.min_balance()

    def to_xdr(self) -> xdr.LedgerEntry:
        entry = xdr.AccountEntry(
            account_id=xdr_account_id(self.account_id),
            balance=xdr.Int64(to_stroops(self.balance)),
            seq_num=xdr.SequenceNumber(xdr.Int64(self.sequence)),
            num_sub_entries=xdr.Uint32(self.subentry_count),
            inflation_dest=None,
            flags=xdr.Uint32(self.flags),
            home_domain=xdr.String32(self.home_domain.encode()),
            thresholds=xdr.Thresholds(bytes([self.master_weight, self.low_threshold,
                                             self.med_threshold, self.high_threshold])),
            signers=[],
            ext=xdr.AccountEntryExt(0),
        )
        return xdr.LedgerEntry(
            xdr.Uint32(self.last_modified_ledger),
            xdr.LedgerEntryData(xdr.LedgerEntryType.ACCOUNT, account=entry),
            xdr.LedgerEntryExt(0),
        )

    def key_xdr(self) -> xdr.LedgerKey:
        return xdr.LedgerKey(xdr.LedgerEntryType.ACCOUNT,
                             account=xdr.LedgerKeyAccount(xdr_account_id(self.account_id)))


@dataclass
class TrustlineEntry:
    """A trustline ledger entry in memory: balance and limit in asset units (Decimal, 7 dp);
    ``flags`` bit 1 = authorized."""

    account_id: str
    code: str
    issuer: str
    balance: Decimal
    limit: Decimal
    flags: int = TRUSTLINE_AUTHORIZED
    last_modified_ledger: int = 0

    def _asset_xdr(self) -> xdr.TrustLineAsset:
        return Asset(self.code, self.issuer).to_trust_line_asset_xdr_object()

    def to_xdr(self) -> xdr.LedgerEntry:
        entry = xdr.TrustLineEntry(
            account_id=xdr_account_id(self.account_id),
            asset=self._asset_xdr(),
            balance=xdr.Int64(to_stroops(self.balance)),
            limit=xdr.Int64(to_stroops(self.limit)),
            flags=xdr.Uint32(self.flags),
            ext=xdr.TrustLineEntryExt(0),
        )
        return xdr.LedgerEntry(
            xdr.Uint32(self.last_modified_ledger),
            xdr.LedgerEntryData(xdr.LedgerEntryType.TRUSTLINE, trust_line=entry),
            xdr.LedgerEntryExt(0),
        )

    def key_xdr(self) -> xdr.LedgerKey:
        return xdr.LedgerKey(xdr.LedgerEntryType.TRUSTLINE, trust_line=xdr.LedgerKeyTrustLine(
            xdr_account_id(self.account_id), self._asset_xdr()))


_ACCOUNT_FIELDS = [f for f in AccountEntry.__dataclass_fields__]
_TRUSTLINE_FIELDS = [f for f in TrustlineEntry.__dataclass_fields__]


class LedgerState:
    """A working copy of the entries one validation or one ledger close reads: loaded
    lazily from the ``sandbox`` database, changed in memory, written back by ``flush``.
    ``checkpoint`` / ``restore`` roll back an operation; ``changes_since`` turns the
    difference into XDR ``LedgerEntryChanges`` (STATE + UPDATED, CREATED, STATE +
    REMOVED) and stamps ``last_modified_ledger`` on what changed."""

    def __init__(self) -> None:
        self.accounts: dict[str, AccountEntry | None] = {}
        self.trustlines: dict[tuple[str, str, str], TrustlineEntry | None] = {}
        self._loaded_accounts: dict[str, AccountEntry | None] = {}
        self._loaded_trustlines: dict[tuple[str, str, str], TrustlineEntry | None] = {}

    # reads
    def account(self, account_id: str) -> AccountEntry | None:
        if account_id not in self.accounts:
            row = models.Account.objects.using(DB).filter(pk=account_id).first()
            entry = None
            if row is not None:
                entry = AccountEntry(**{name: getattr(row, name) for name in _ACCOUNT_FIELDS})
            self.accounts[account_id] = entry
            self._loaded_accounts[account_id] = copy.deepcopy(entry)
        return self.accounts[account_id]

    def trustline(self, account_id: str, asset: AssetKey) -> TrustlineEntry | None:
        key = (account_id, asset.code, asset.issuer)
        if key not in self.trustlines:
            row = models.Trustline.objects.using(DB).filter(
                account_id=account_id, asset_code=asset.code, asset_issuer=asset.issuer).first()
            entry = None
            if row is not None:
                entry = TrustlineEntry(
                    account_id=row.account_id, code=row.asset_code, issuer=row.asset_issuer,
                    balance=row.balance, limit=row.limit, flags=row.flags,
                    last_modified_ledger=row.last_modified_ledger)
            self.trustlines[key] = entry
            self._loaded_trustlines[key] = copy.deepcopy(entry)
        return self.trustlines[key]

    # writes (in memory)
    def create_account(self, entry: AccountEntry) -> None:
        self.account(entry.account_id)
        self.accounts[entry.account_id] = entry

    def set_trustline(self, key: tuple[str, str, str], entry: TrustlineEntry | None) -> None:
        self.trustlines[key] = entry

    # rollback
    def checkpoint(self) -> tuple[dict, dict]:
        return copy.deepcopy(self.accounts), copy.deepcopy(self.trustlines)

    def restore(self, checkpoint: tuple[dict, dict]) -> None:
        accounts, trustlines = copy.deepcopy(checkpoint)
        # Entries first loaded after the checkpoint were unchanged at load time.
        for key in set(self.accounts) - set(accounts):
            accounts[key] = copy.deepcopy(self._loaded_accounts[key])
        for key in set(self.trustlines) - set(trustlines):
            trustlines[key] = copy.deepcopy(self._loaded_trustlines[key])
        self.accounts, self.trustlines = accounts, trustlines

    def changes_since(self, checkpoint: tuple[dict, dict], *, ledger_seq: int,
                      close_time: int) -> list[xdr.LedgerEntryChange]:
        old_accounts, old_trustlines = checkpoint
        changes: list[xdr.LedgerEntryChange] = []
        pairs = []
        for key in sorted(self.accounts):
            before = old_accounts.get(key, self._loaded_accounts.get(key))
            pairs.append((before, self.accounts[key]))
        for key in sorted(self.trustlines):
            before = old_trustlines.get(key, self._loaded_trustlines.get(key))
            pairs.append((before, self.trustlines[key]))
        for before, after in pairs:
            if before == after:
                continue
            if after is not None:
                after.last_modified_ledger = ledger_seq
                if isinstance(after, AccountEntry):
                    after.last_modified_time = close_time
            change = xdr.LedgerEntryChange
            kind = xdr.LedgerEntryChangeType
            if before is None:
                changes.append(change(kind.LEDGER_ENTRY_CREATED, created=after.to_xdr()))
            elif after is None:
                changes.append(change(kind.LEDGER_ENTRY_STATE, state=before.to_xdr()))
                changes.append(change(kind.LEDGER_ENTRY_REMOVED, removed=before.key_xdr()))
            else:
                changes.append(change(kind.LEDGER_ENTRY_STATE, state=before.to_xdr()))
                changes.append(change(kind.LEDGER_ENTRY_UPDATED, updated=after.to_xdr()))
        return changes

    def flush(self) -> None:
        """Write every changed entry back to the ``sandbox`` database (in the caller's
        transaction)."""
        for key, entry in self.accounts.items():
            if entry == self._loaded_accounts.get(key):
                continue
            if entry is None:
                models.Account.objects.using(DB).filter(pk=key).delete()
            else:
                values = {name: getattr(entry, name) for name in _ACCOUNT_FIELDS}
                values.pop("account_id")
                models.Account.objects.using(DB).update_or_create(account_id=key,
                                                                   defaults=values)
        for key, entry in self.trustlines.items():
            if entry == self._loaded_trustlines.get(key):
                continue
            account_id, code, issuer = key
            lookup = {"account_id": account_id, "asset_code": code, "asset_issuer": issuer}
            if entry is None:
                models.Trustline.objects.using(DB).filter(**lookup).delete()
            else:
                models.Trustline.objects.using(DB).update_or_create(**lookup, defaults={
                    "balance": entry.balance, "limit": entry.limit, "flags": entry.flags,
                    "last_modified_ledger": entry.last_modified_ledger})
        self._loaded_accounts = copy.deepcopy(self.accounts)
        self._loaded_trustlines = copy.deepcopy(self.trustlines)


# --- validation ------------------------------------------------------------------

class SignatureChecker:
    """Which of the envelope's signatures sign for which account (master key only)."""

    def __init__(self, tx_hash: bytes, signatures: list[xdr.DecoratedSignature]) -> None:
        self.tx_hash = tx_hash
        self.signatures = signatures
        self.used = [False] * len(signatures)

    def weight_of(self, account_id: str, master_weight: int = 1) -> int:
        keypair = Keypair.from_public_key(account_id)
        hint = keypair.raw_public_key()[-4:]
        for i, signature in enumerate(self.signatures):
            if signature.hint.signature_hint != hint:
                continue
            try:
                keypair.verify(self.tx_hash, signature.signature.signature)
            except BadSignatureError:
                continue
            self.used[i] = True
            return master_weight
        return 0

    def signed(self, account_id: str, *, master_weight: int = 1, threshold: int = 0) -> bool:
        # SignatureChecker::checkSignature: total weight must exceed the threshold.
        return self.weight_of(account_id, master_weight) > threshold

    def all_used(self) -> bool:
        return all(self.used)


def _op_static_result(op: ParsedOp, source: str) -> xdr.OperationResult | None:
    """``doCheckValid`` of an operation: None when well-formed, else its result."""
    body = op.body
    if op.type not in SUPPORTED_OPS:
        return op_outer_result(xdr.OperationResultCode.opNOT_SUPPORTED)
    if op.type == OPS.CREATE_ACCOUNT:
        if (body.create_account_op.starting_balance.int64 < 0
                or address_of(body.create_account_op.destination) == source):
            return op_inner_result(op.type, _CA.CREATE_ACCOUNT_MALFORMED)
    elif op.type == OPS.PAYMENT:
        try:
            asset_from_xdr(body.payment_op.asset)
        except InvalidAsset:
            return op_inner_result(op.type, _PAY.PAYMENT_MALFORMED)
        if body.payment_op.amount.int64 <= 0:
            return op_inner_result(op.type, _PAY.PAYMENT_MALFORMED)
    elif op.type == OPS.CHANGE_TRUST:
        try:
            asset = asset_from_xdr(body.change_trust_op.line)
        except InvalidAsset:
            if body.change_trust_op.line.type == xdr.AssetType.ASSET_TYPE_POOL_SHARE:
                return op_outer_result(xdr.OperationResultCode.opNOT_SUPPORTED)
            return op_inner_result(op.type, _CT.CHANGE_TRUST_MALFORMED)
        if asset.native or body.change_trust_op.limit.int64 < 0:
            return op_inner_result(op.type, _CT.CHANGE_TRUST_MALFORMED)
        if asset.issuer == source:
            return op_inner_result(op.type, _CT.CHANGE_TRUST_MALFORMED)
    return None


def check_valid(env: Envelope, state: LedgerState, *, ledger_seq: int, close_time_lower: int,
                close_time_upper: int, for_apply: bool = False) -> TxResult | None:
    """stellar-core ``TransactionFrame::checkValid`` against ``state``.

    ledger_seq: the ledger the transaction would be applied in (last closed + 1).
    close_time_lower / close_time_upper: unix seconds the time bounds are compared with
    (at submission: last close time / an estimate of the next close time, core's
    ``upperBoundCloseTimeOffset``; at apply: the new ledger's close time for both).
    Returns None when valid, else the TxResult the submission is refused with (nothing
    is charged)."""
    fee_bid = env.fee
    if env.fee_bump or env.extra_signers:
        return TxResult(TX.txNOT_SUPPORTED, fee_bid)
    if not env.ops:
        return TxResult(TX.txMISSING_OPERATION, fee_bid)
    if len(env.ops) > MAX_OPERATIONS:
        return TxResult(TX.txMALFORMED, fee_bid)
    if env.time_bounds:
        min_time, max_time = env.time_bounds
        if min_time and min_time > close_time_lower:
            return TxResult(TX.txTOO_EARLY, fee_bid)
        if max_time and max_time < close_time_upper:
            return TxResult(TX.txTOO_LATE, fee_bid)
    if env.ledger_bounds:
        min_ledger, max_ledger = env.ledger_bounds
        if min_ledger > ledger_seq:
            return TxResult(TX.txTOO_EARLY, fee_bid)
        if max_ledger and max_ledger <= ledger_seq:
            return TxResult(TX.txTOO_LATE, fee_bid)
    if fee_bid < BASE_FEE * len(env.ops):
        return TxResult(TX.txINSUFFICIENT_FEE, fee_bid)
    source = state.account(env.source)
    if source is None:
        return TxResult(TX.txNO_ACCOUNT, fee_bid)
    if env.min_seq_num is None:
        if env.sequence != source.sequence + 1:
            return bad_seq_result()
    elif not env.min_seq_num <= source.sequence < env.sequence:
        return bad_seq_result()
    if env.min_seq_age and (source.sequence_time or 0) + env.min_seq_age > close_time_lower:
        return TxResult(TX.txBAD_MIN_SEQ_AGE_OR_GAP, fee_bid)
    if env.min_seq_ledger_gap and (source.sequence_ledger or 0) + env.min_seq_ledger_gap \
            > ledger_seq:
        return TxResult(TX.txBAD_MIN_SEQ_AGE_OR_GAP, fee_bid)
    checker = SignatureChecker(env.hash_bytes, env.signatures)
    if not checker.signed(env.source, master_weight=source.master_weight,
                          threshold=source.low_threshold):
        return TxResult(TX.txBAD_AUTH, fee_bid)
    if source.available() < amount_from_stroops(fee_bid):
        return TxResult(TX.txINSUFFICIENT_BALANCE, fee_bid)

    op_results: list[xdr.OperationResult] = []
    ops_ok = True
    for op in env.ops:
        op_source, _, _ = env.op_source(op)
        account = state.account(op_source)
        result = None
        if account is None:
            if for_apply or op.source is None:
                result = op_outer_result(xdr.OperationResultCode.opNO_ACCOUNT)
            elif not checker.signed(op_source):
                result = op_outer_result(xdr.OperationResultCode.opBAD_AUTH)
        elif not checker.signed(op_source, master_weight=account.master_weight,
                                threshold=account.med_threshold):
            result = op_outer_result(xdr.OperationResultCode.opBAD_AUTH)
        if result is None:
            result = _op_static_result(op, op_source)
        if result is None:
            result = op_success(op.type)
        else:
            ops_ok = False
        op_results.append(result)
    if not ops_ok:
        return TxResult(TX.txFAILED, fee_bid, op_results)
    if not checker.all_used():
        return TxResult(TX.txBAD_AUTH_EXTRA, fee_bid)
    return None


# --- applying --------------------------------------------------------------------

@dataclass
class Applied:
    """One transaction applied in a ledger: its result, fee meta and meta (XDR)."""

    env: Envelope
    result: TxResult
    fee_meta_xdr: str
    meta_xdr: str


def _apply_create_account(state: LedgerState, op: ParsedOp, source: AccountEntry,
                          ledger_seq: int) -> xdr.OperationResult:
    body = op.body.create_account_op
    destination = address_of(body.destination)
    amount = amount_from_stroops(body.starting_balance.int64)
    if state.account(destination) is not None:
        return op_inner_result(op.type, _CA.CREATE_ACCOUNT_ALREADY_EXIST)
    if amount < 2 * BASE_RESERVE:
        return op_inner_result(op.type, _CA.CREATE_ACCOUNT_LOW_RESERVE)
    if source.available() < amount:
        return op_inner_result(op.type, _CA.CREATE_ACCOUNT_UNDERFUNDED)
    source.balance -= amount
    # A new account's sequence starts at ledgerSeq << 32 (protocol >= 10).
    state.create_account(AccountEntry(account_id=destination, balance=amount,
                                      sequence=ledger_seq << 32))
    return op_success(op.type)


def _apply_payment(state: LedgerState, op: ParsedOp,
                   source: AccountEntry) -> xdr.OperationResult:
    body = op.body.payment_op
    asset = asset_from_xdr(body.asset)
    amount = amount_from_stroops(body.amount.int64)
    destination_id, _, _ = muxed_parts(body.destination)
    fail = lambda code: op_inner_result(op.type, code)  # noqa: E731
    destination = state.account(destination_id)
    if destination is None:
        return fail(_PAY.PAYMENT_NO_DESTINATION)
    if asset.native:
        if destination.balance + amount > MAX_AMOUNT:
            return fail(_PAY.PAYMENT_LINE_FULL)
        if source.available() < amount:
            return fail(_PAY.PAYMENT_UNDERFUNDED)
        source.balance -= amount
        destination.balance += amount
        return op_success(op.type)
    # Credit asset: destination side first, then source (PathPaymentStrictReceive).
    dest_line = None
    if destination_id != asset.issuer:
        dest_line = state.trustline(destination_id, asset)
        if dest_line is None:
            return fail(_PAY.PAYMENT_NO_TRUST)
        if not dest_line.flags & TRUSTLINE_AUTHORIZED:
            return fail(_PAY.PAYMENT_NOT_AUTHORIZED)
        if dest_line.balance + amount > dest_line.limit:
            return fail(_PAY.PAYMENT_LINE_FULL)
    src_line = None
    if source.account_id != asset.issuer:
        src_line = state.trustline(source.account_id, asset)
        if src_line is None:
            return fail(_PAY.PAYMENT_SRC_NO_TRUST)
        if not src_line.flags & TRUSTLINE_AUTHORIZED:
            return fail(_PAY.PAYMENT_SRC_NOT_AUTHORIZED)
        if src_line.balance < amount:
            return fail(_PAY.PAYMENT_UNDERFUNDED)
    if src_line is not None:
        src_line.balance -= amount
    if dest_line is not None:
        dest_line.balance += amount
    return op_success(op.type)


def _apply_change_trust(state: LedgerState, op: ParsedOp,
                        source: AccountEntry) -> xdr.OperationResult:
    body = op.body.change_trust_op
    asset = asset_from_xdr(body.line)
    limit = amount_from_stroops(body.limit.int64)
    key = (source.account_id, asset.code, asset.issuer)
    line = state.trustline(source.account_id, asset)
    fail = lambda code: op_inner_result(op.type, code)  # noqa: E731
    if line is not None:
        if limit == 0:
            if line.balance != 0:
                return fail(_CT.CHANGE_TRUST_INVALID_LIMIT)
            state.set_trustline(key, None)
            source.subentry_count -= 1
            return op_success(op.type)
        if limit < line.balance:
            return fail(_CT.CHANGE_TRUST_INVALID_LIMIT)
        line.limit = limit
        return op_success(op.type)
    if limit == 0:
        # Removing a trustline that does not exist (ChangeTrustOpFrame, protocol >= 16).
        return fail(_CT.CHANGE_TRUST_INVALID_LIMIT)
    if state.account(asset.issuer) is None:
        return fail(_CT.CHANGE_TRUST_NO_ISSUER)
    if source.balance < (3 + source.subentry_count) * BASE_RESERVE:
        return fail(_CT.CHANGE_TRUST_LOW_RESERVE)
    state.set_trustline(key, TrustlineEntry(account_id=source.account_id, code=asset.code,
                                            issuer=asset.issuer, balance=Decimal("0E-7"),
                                            limit=limit))
    source.subentry_count += 1
    return op_success(op.type)


def apply_operation(state: LedgerState, env: Envelope, op: ParsedOp,
                    ledger_seq: int) -> xdr.OperationResult:
    """Apply one operation to ``state``; return its result (changes are left in
    ``state`` even on failure: the caller rolls back)."""
    source_id, _, _ = env.op_source(op)
    source = state.account(source_id)
    if source is None:
        return op_outer_result(xdr.OperationResultCode.opNO_ACCOUNT)
    if op.type == OPS.CREATE_ACCOUNT:
        return _apply_create_account(state, op, source, ledger_seq)
    if op.type == OPS.PAYMENT:
        return _apply_payment(state, op, source)
    if op.type == OPS.CHANGE_TRUST:
        return _apply_change_trust(state, op, source)
    return op_outer_result(xdr.OperationResultCode.opNOT_SUPPORTED)


def apply_transaction(state: LedgerState, env: Envelope, *, ledger_seq: int,
                      close_time: int) -> Applied:
    """Charge the fee, consume the sequence and apply the operations of a transaction
    that passed ``check_valid`` (stellar-core ``processFeeSeqNum`` + ``apply``).

    The fee is base fee x operations in stroops (no surge pricing). When an operation
    fails, the remaining ones are still evaluated for their results, every operation's
    changes are rolled back, and the result is ``txFAILED`` (fee and sequence stay)."""
    fee = BASE_FEE * len(env.ops)
    source = state.account(env.source)
    checkpoint = state.checkpoint()
    source.balance -= amount_from_stroops(fee)
    fee_changes = state.changes_since(checkpoint, ledger_seq=ledger_seq, close_time=close_time)

    checkpoint = state.checkpoint()
    source = state.account(env.source)
    source.sequence = env.sequence
    source.sequence_ledger = ledger_seq
    source.sequence_time = close_time
    before_changes = state.changes_since(checkpoint, ledger_seq=ledger_seq,
                                         close_time=close_time)

    tx_checkpoint = state.checkpoint()
    results: list[xdr.OperationResult] = []
    op_metas: list[xdr.OperationMeta] = []
    failed = False
    for op in env.ops:
        op_checkpoint = state.checkpoint()
        result = apply_operation(state, env, op, ledger_seq)
        results.append(result)
        if failed or not op_result_ok(result):
            failed = True
            state.restore(op_checkpoint)
            continue
        op_metas.append(xdr.OperationMeta(xdr.LedgerEntryChanges(
            state.changes_since(op_checkpoint, ledger_seq=ledger_seq, close_time=close_time))))
    if failed:
        state.restore(tx_checkpoint)
        op_metas = []
    meta = xdr.TransactionMeta(3, v3=xdr.TransactionMetaV3(
        ext=xdr.ExtensionPoint(0),
        tx_changes_before=xdr.LedgerEntryChanges(before_changes),
        operations=op_metas,
        tx_changes_after=xdr.LedgerEntryChanges([]),
        soroban_meta=None,
    ))
    result = TxResult(TX.txFAILED if failed else TX.txSUCCESS, fee, results)
    return Applied(env, result, xdr.LedgerEntryChanges(fee_changes).to_xdr(), meta.to_xdr())


# --- ledger headers --------------------------------------------------------------

def ledger_header(*, sequence: int, prev_hash: str, close_time: int, tx_hashes: list[str],
                  result_xdrs: list[str], total_coins: Decimal,
                  fee_pool: Decimal) -> tuple[str, str]:
    """Build the ledger's XDR LedgerHeader; return (header_xdr base64, hash hex =
    sha256 of the header XDR, as stellar-core hashes ledger headers)."""
    tx_set_hash = hashlib.sha256(b"".join(bytes.fromhex(h) for h in tx_hashes)).digest()
    results_hash = hashlib.sha256(
        b"".join(base64.b64decode(r) for r in result_xdrs)).digest()
    header = xdr.LedgerHeader(
        ledger_version=xdr.Uint32(PROTOCOL_VERSION),
        previous_ledger_hash=xdr.Hash(bytes.fromhex(prev_hash)),
        scp_value=xdr.StellarValue(
            tx_set_hash=xdr.Hash(tx_set_hash),
            close_time=xdr.TimePoint(xdr.Uint64(close_time)),
            upgrades=[],
            ext=xdr.StellarValueExt(xdr.StellarValueType.STELLAR_VALUE_BASIC),
        ),
        tx_set_result_hash=xdr.Hash(results_hash),
        bucket_list_hash=xdr.Hash(hashlib.sha256(f"sandbox-{sequence}".encode()).digest()),
        ledger_seq=xdr.Uint32(sequence),
        total_coins=xdr.Int64(to_stroops(total_coins)),
        fee_pool=xdr.Int64(to_stroops(fee_pool)),
        inflation_seq=xdr.Uint32(0),
        id_pool=xdr.Uint64(0),
        base_fee=xdr.Uint32(BASE_FEE),
        base_reserve=xdr.Uint32(BASE_RESERVE_STROOPS),
        max_tx_set_size=xdr.Uint32(MAX_TX_SET_SIZE),
        skip_list=[xdr.Hash(bytes(32)) for _ in range(4)],
        ext=xdr.LedgerHeaderExt(0),
    )
    raw = header.to_xdr_bytes()
    return base64.b64encode(raw).decode(), hashlib.sha256(raw).hexdigest()


def toid(ledger: int, tx_order: int = 0, op_index: int = 0) -> int:
    """SEP-35 TOID: ledger << 32 | tx_application_order << 12 | operation_index."""
    return (ledger << 32) | (tx_order << 12) | op_index
