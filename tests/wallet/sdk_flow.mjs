// Stellar's TypeScript wallet SDK, as published (no patches; documented options only),
// against the sandbox AP: SEP-1, SEP-10 with a fresh account, SEP-24 info, an interactive
// deposit started and read back. Driven by tests/test_wallet_sdk.py, which passes
// SANDBOX_URL and NETWORK_PASSPHRASE and reads one JSON object per line on stdout.
import walletSdk from "@stellar/typescript-wallet-sdk"; // a CommonJS bundle
import stellarSdk from "@stellar/stellar-sdk";

const { ApplicationConfiguration, SigningKeypair, StellarConfiguration, Wallet } = walletSdk;
const { Horizon, Keypair } = stellarSdk;

const base = process.env.SANDBOX_URL;
const homeDomain = new URL(base).host; // host:port, as the sandbox serves its toml
const say = (event, data = {}) => console.log(JSON.stringify({ event, ...data }));

// StellarConfiguration builds its Horizon server at once and refuses http; it is made
// for the https form of the URL, then given a server built with allowHttp (stellar-sdk's
// documented option for a local Horizon), which is what every SDK call uses.
const stellar = new StellarConfiguration({
  network: process.env.NETWORK_PASSPHRASE,
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

  // The wallet's own account (funded and trusting USDC by the test) deposits.
  const owner = SigningKeypair.fromSecret(process.env.WALLET_SECRET);
  const ownerToken = await (await anchor.sep10()).authenticate({ accountKp: owner });
  const started = await sep24.deposit({ assetCode: "USDC", authToken: ownerToken });
  say("deposit_started", { id: started.id, url: started.url, type: started.type });
  const read = await sep24.getTransactionBy({ authToken: ownerToken, id: started.id });
  say("deposit_read", { id: read.id, status: read.status, kind: read.kind });
  const listed = await sep24.getTransactionsForAsset({ authToken: ownerToken,
                                                       assetCode: "USDC" });
  say("deposit_listed", { ids: listed.map((t) => t.id) });
  // The test plays the webview now; the SDK's watcher follows the transaction to its end.
  const seen = [];
  let timer;
  const final = await new Promise((resolve, reject) => {
    const { stop } = sep24.watcher().watchOneTransaction({
      authToken: ownerToken, assetCode: "USDC", id: started.id, timeout: 500,
      onMessage: (t) => { if (!seen.includes(t.status)) seen.push(t.status); },
      onSuccess: (t) => { stop(); resolve(t); },
      onError: (e) => { stop(); reject(e instanceof Error ? e : new Error(JSON.stringify(e))); },
    });
    timer = setTimeout(() => { stop(); reject(new Error(`no final status; saw ${seen}`)); },
                       90000);
  }).finally(() => clearTimeout(timer));
  say("deposit_final", { status: final.status, seen,
                         stellar_transaction_id: final.stellar_transaction_id ?? null });
  say("done");
} catch (error) {
  say("error", { message: String(error?.message || error),
                 response: error?.response?.data ?? null });
  process.exitCode = 1;
}
process.exit();
