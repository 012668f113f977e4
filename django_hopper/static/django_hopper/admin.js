// Hopper's admin: confirmations for job buttons, and the overview's live refresh.
"use strict";
document.addEventListener("click", function (event) {
  const button = event.target.closest("[data-confirm]");
  if (button && !window.confirm(button.dataset.confirm)) {
    event.preventDefault();
  }
});

(function () {
  const root = document.getElementById("hopper-overview");
  const toggle = document.getElementById("hopper-live");
  if (!root || !toggle) {
    return;
  }
  const key = "hopper-overview-live";
  const every = Number(root.dataset.refreshSeconds || "5") * 1000;
  toggle.checked = window.localStorage.getItem(key) !== "off";
  let timer = null;
  function refresh() {
    fetch(root.dataset.partialUrl, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) { return response.ok ? response.text() : Promise.reject(response.status); })
      .then(function (html) {
        const body = document.getElementById("hopper-overview-body");
        if (body) { body.innerHTML = html; }
        root.dataset.refreshedAt = String(Date.now());
      })
      .catch(function () { /* keep the last view; the next tick tries again */ });
  }
  function schedule() {
    if (timer) { window.clearInterval(timer); timer = null; }
    if (toggle.checked) { timer = window.setInterval(refresh, every); }
  }
  toggle.addEventListener("change", function () {
    window.localStorage.setItem(key, toggle.checked ? "on" : "off");
    schedule();
  });
  schedule();
})();
