/* Progressive enhancement only: every page works without it. */
(function () {
  "use strict";
  // Withdrawal form: show the fields of the chosen payout method (both show without JS).
  var radios = document.querySelectorAll("input[name=method][type=radio]");
  function showMethod() {
    var checked = document.querySelector("input[name=method]:checked") ||
      document.querySelector("input[name=method][type=hidden]");
    if (!checked) { return; }
    document.querySelectorAll("[data-method]").forEach(function (el) {
      el.hidden = el.getAttribute("data-method") !== checked.value;
    });
  }
  radios.forEach(function (r) { r.addEventListener("change", showMethod); });
  showMethod();

  // Copy buttons next to the account and memo a customer pays by hand.
  document.querySelectorAll("button.copy[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var text = button.getAttribute("data-copy");
      var done = function () { button.textContent = "Copied"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, function () {});
      } else {
        var area = document.createElement("textarea");
        area.value = text; document.body.appendChild(area); area.select();
        try { document.execCommand("copy"); done(); } catch (e) { /* leave as is */ }
        document.body.removeChild(area);
      }
    });
  });

  // Back from another page (bfcache): buttons disabled by a submit work again.
  window.addEventListener("pageshow", function () {
    document.querySelectorAll("button[type=submit]").forEach(function (b) { b.disabled = false; });
  });

  // One tap per submit: a second tap would post the same form again.
  document.querySelectorAll("form").forEach(function (form) {
    form.addEventListener("submit", function () {
      window.setTimeout(function () {
        form.querySelectorAll("button[type=submit]").forEach(function (b) { b.disabled = true; });
      }, 0);
    });
  });

  // The browser tests read this to know the script loaded and ran to the end.
  document.documentElement.dataset.sep24js = "ready";
})();
