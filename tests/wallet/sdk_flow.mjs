// Stellar's TypeScript wallet SDK, as published (no patches; documented options only),
// against the sandbox AP: SEP-1, SEP-10 with a fresh account, SEP-24 info, then one
// interactive flow (FLOW=deposit or FLOW=withdrawal) followed by the SDK's watcher to its
// final status; a withdrawal's on-chain USDC payment is built, signed and submitted with
// the SDK once the watcher sees pending_user_transfer_start. Driven by
// tests/test_wallet_sdk.py, which passes SANDBOX_URL, NETWORK_PASSPHRASE, WALLET_SECRET,
// FLOW, USDC_ISSUER, WATCH_POLL_MS and WATCH_TIMEOUT_S and reads one JSON object per line
// on stdout (it plays the webview and Corridor's side between the steps).
import walletSdk from "@stellar/typescript-wallet-sdk"; // a CommonJS bundle
import stellarSdk from "@stellar/stellar-sdk";

const { ApplicationConfiguration, IssuedAssetId, SigningKeypair, StellarConfiguration,
        Wallet } = walletSdk;
const { Horizon, Keypair } = stellarSdk;

const env = (name) => {
  if (!process.env[name]) throw new Error(`${name} is not set`);
  return process.env[name];
};
const base = env("SANDBOX_URL");
const flow = env("FLOW");
const homeDomain = new URL(base).host; // host:port, as the sandbox serves its toml
const say = (event, data = {}) => console.log(JSON.stringify({ event, ...data }));

// StellarConfiguration builds its Horizon server at once and refuses http; it is made
// for the https form of the URL, then given a server built with allowHttp (stellar-sdk's
// documented option for a local Horizon), which is what every SDK call uses.
const stellar = new StellarConfiguration({
  network: env("NETWORK_PASSPHRASE"),
  horizonUrl: `${base.replace(/^http:/, "https:")}/horizon`,
  baseFee: 100,
  defaultTimeout: 60,
});
stellar.horizonUrl = `${base}/horizon`;
stellar.server = new Horizon.Server(stellar.horizonUrl, { allowHttp: true });
const wallet = new Wallet({
  stellarConfiguration: stellar,
  applicationConfiguration: new ApplicationConfiguration(),
});
const anchor = wallet.anchor({ homeDomain, allowHttp: true });
const usdc = new IssuedAssetId("USDC", env("USDC_ISSUER"));

// The SDK's watcher on one transaction until a final status (onSuccess: completed,
// refunded, expired); ``onStatus(transaction)`` runs once per new non-final status.
function watch(sep24, authToken, id, onStatus = async () => {}) {
  const seen = [];
  let timer;
  return new Promise((resolve, reject) => {
    const fail = (e) => { stop(); reject(e instanceof Error ? e : new Error(JSON.stringify(e))); };
    const { stop } = sep24.watcher().watchOneTransaction({
      authToken, assetCode: "USDC", id, timeout: Number(env("WATCH_POLL_MS")),
      onMessage: (t) => {
        if (seen.includes(t.status)) return;
        seen.push(t.status);
        onStatus(t).catch(fail);
      },
      onSuccess: (t) => { stop(); resolve({ transaction: t, seen }); },
      onError: fail,
    });
    timer = setTimeout(() => fail(new Error(`no final status; saw ${seen}`)),
                       Number(env("WATCH_TIMEOUT_S")) * 1000);
  }).finally(() => clearTimeout(timer));
}

async function deposit(sep24, ownerToken) {
  const started = await sep24.deposit({ assetCode: "USDC", authToken: ownerToken });
  say("deposit_started", { id: started.id, url: started.url, type: started.type });
  const read = await sep24.getTransactionBy({ authToken: ownerToken, id: started.id });
  say("deposit_read", { id: read.id, status: read.status, kind: read.kind });
  const listed = await sep24.getTransactionsForAsset({ authToken: ownerToken,
                                                       assetCode: "USDC" });
  say("deposit_listed", { ids: listed.map((t) => t.id) });
  // The test plays the webview now; the SDK's watcher follows the transaction to its end.
  const { transaction: final, seen } = await watch(sep24, ownerToken, started.id);
  say("deposit_final", { status: final.status, seen,
                         stellar_transaction_id: final.stellar_transaction_id ?? null });
}

async function withdrawal(sep24, ownerToken, owner) {
  const started = await sep24.withdraw({ assetCode: "USDC", authToken: ownerToken });
  say("withdrawal_started", { id: started.id, url: started.url, type: started.type });
  // The test fills Corridor's withdrawal form in the webview now. Once the watcher sees
  // pending_user_transfer_start, the wallet pays the transaction's withdraw_anchor_account
  // with its memo and amount_in, all taken by the SDK from the transaction itself.
  const pay = async (t) => {
    if (t.status !== "pending_user_transfer_start") return;
    say("withdrawal_pending_user_transfer_start", {
      id: t.id, withdraw_anchor_account: t.withdraw_anchor_account,
      withdraw_memo: t.withdraw_memo, withdraw_memo_type: t.withdraw_memo_type,
      amount_in: t.amount_in });
    // No timebounds: the SDK sets the configuration's defaultTimeout.
    const builder = await wallet.stellar().transaction({ sourceAddress: owner });
    const payment = builder.transferWithdrawalTransaction(t, usdc).build();
    owner.sign(payment);
    await wallet.stellar().submitTransaction(payment);
    say("withdrawal_paid", { hash: payment.hash().toString("hex") });
  };
  const { transaction: final, seen } = await watch(sep24, ownerToken, started.id, pay);
  say("withdrawal_final", { status: final.status, seen,
                            stellar_transaction_id: final.stellar_transaction_id ?? null,
                            external_transaction_id: final.external_transaction_id ?? null,
                            amount_in: final.amount_in, amount_out: final.amount_out });
}

try {
  const toml = await anchor.sep1();
  say("sep1", { signingKey: toml.signingKey, webAuthEndpoint: toml.webAuthEndpoint,
                transferServerSep24: toml.transferServerSep24,
                currencies: (toml.currencies || []).map((c) => c.code) });

  const fresh = SigningKeypair.fromSecret(Keypair.random().secret());
  const auth = await anchor.sep10();
  const token = await auth.authenticate({ accountKp: fresh });
  say("sep10", { account: token.account, expiresAt: token.expiresAt });

  const sep24 = anchor.sep24();
  const info = await sep24.info();
  say("sep24_info", { deposit: Object.keys(info.deposit || {}),
                      withdraw: Object.keys(info.withdraw || {}) });

  // The wallet's own account (funded and trusting USDC by the test) runs the flow.
  const owner = SigningKeypair.fromSecret(env("WALLET_SECRET"));
  const ownerToken = await (await anchor.sep10()).authenticate({ accountKp: owner });
  if (flow === "deposit") await deposit(sep24, ownerToken);
  else if (flow === "withdrawal") await withdrawal(sep24, ownerToken, owner);
  else throw new Error(`FLOW must be deposit or withdrawal, not ${flow}`);
  say("done");
} catch (error) {
  say("error", { message: String(error?.message || error),
                 response: error?.response?.data ?? null });
  process.exitCode = 1;
}
process.exit();
