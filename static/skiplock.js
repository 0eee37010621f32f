// Skiplock's only script besides htmx: adaptive polling, the tab title, error toasts, confirm
// dialogs and the small behaviours the templates ask for with data- attributes. The console's
// Content-Security-Policy allows no inline script: no onclick="" or javascript: links in templates.
(function () {
  "use strict";
  var body = document.body;
  var fast = parseInt(body.dataset.pollFast || "5000", 10);
  var slow = parseInt(body.dataset.pollSlow || "60000", 10);
  var timer = null;

  // Elements marked data-poll (with hx-trigger="poll") refresh fast while the tab is visible
  // and slowly while it is hidden; coming back to the tab refreshes at once.
  function tick() {
    document.querySelectorAll("[data-poll]").forEach(function (el) {
      if (window.htmx) { htmx.trigger(el, "poll"); }
    });
    schedule();
  }
  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(tick, document.hidden ? slow : fast);
  }
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { schedule(); } else { tick(); }
  });
  // A poll says so with X-Skiplock-Poll: 1; the server does not count it as activity, so a tab
  // left open does not keep a sign-in alive past web.session_idle (console/web/auth.py).
  document.addEventListener("htmx:configRequest", function (e) {
    var trigger = e.detail.triggeringEvent;
    if (trigger && trigger.type === "poll") { e.detail.headers["X-Skiplock-Poll"] = "1"; }
  });

  // The tab title carries the state: the first [data-tab-state] on the page, if any.
  function updateTitle() {
    var el = document.querySelector("[data-tab-state]");
    var state = el ? el.getAttribute("data-tab-state") : "";
    var base = body.dataset.title || "Skiplock";
    document.title = state ? state + " · " + base : base;
  }

  // Errors from htmx requests (403, 409, ...) appear as a toast with the server's message.
  function toast(text, bad) {
    var el = document.getElementById("toast");
    if (!el) { return; }
    el.textContent = text;
    el.className = bad ? "bad" : "";
    el.hidden = false;
    clearTimeout(el._timer);
    el._timer = setTimeout(function () { el.hidden = true; }, 8000);
  }
  document.addEventListener("htmx:responseError", function (e) {
    var xhr = e.detail.xhr;
    var text = (xhr.responseText || "").slice(0, 300);
    toast(xhr.status + ": " + (text || xhr.statusText), true);
  });
  document.addEventListener("htmx:sendError", function () { toast("The console is unreachable.", true); });
  document.addEventListener("htmx:afterSettle", updateTitle);

  // Confirm dialogs: <button data-confirm="Purge job 42?">.
  document.addEventListener("submit", function (e) {
    var btn = e.submitter;
    var msg = (btn && btn.dataset.confirm) || e.target.dataset.confirm;
    if (msg && !window.confirm(msg)) { e.preventDefault(); }
  }, true);

  // <input type="checkbox" data-select-all="ids"> ticks every input[name=ids] of its form
  // (or of the page when it has no form).
  document.addEventListener("change", function (e) {
    var box = e.target;
    if (!box.matches || !box.matches("input[type=checkbox][data-select-all]")) { return; }
    var scope = box.form || document;
    var name = box.getAttribute("data-select-all");
    scope.querySelectorAll("input[type=checkbox]").forEach(function (c) {
      if (c.name === name) { c.checked = box.checked; }
    });
  });

  // <a href="..." data-back>: go back in history when there is somewhere to go back to.
  document.addEventListener("click", function (e) {
    var link = e.target.closest && e.target.closest("a[data-back]");
    if (link && window.history.length > 1) { e.preventDefault(); window.history.back(); }
  });

  updateTitle();
  schedule();
})();
