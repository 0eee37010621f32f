// Skiplock's only script besides htmx: polling while visible, keyboard shortcuts, the tab title, error toasts, confirm
// dialogs and the small behaviours the templates ask for with data- attributes. The console's
// Content-Security-Policy allows no inline script: no onclick="" or javascript: links in templates.
(function () {
  "use strict";
  var body = document.body;
  var fast = parseInt(body.dataset.pollFast || "5000", 10);
  var timers = {};

  // Elements marked data-poll (with hx-trigger="poll") refresh every web.poll_fast while the
  // tab is visible, or every N ms with data-poll="N" (a bulk operation's progress: 1000). A
  // hidden tab does not poll at all; showing it again refreshes everything at once, and the
  // tab title follows the fresh fragments.
  function every(el) {
    var ms = parseInt(el.getAttribute("data-poll"), 10);
    return ms > 0 ? ms : fast;
  }
  function poll(ms) {
    if (document.hidden || !window.htmx) { return; }
    document.querySelectorAll("[data-poll]").forEach(function (el) {
      if (ms === null || every(el) === ms) { htmx.trigger(el, "poll"); }
    });
  }
  function start() {
    if (document.hidden) { return; }
    document.querySelectorAll("[data-poll]").forEach(function (el) {
      var ms = every(el);
      if (!timers[ms]) { timers[ms] = setInterval(function () { poll(ms); }, ms); }
    });
  }
  function stop() {
    Object.keys(timers).forEach(function (ms) { clearInterval(timers[ms]); });
    timers = {};
  }
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { stop(); } else { poll(null); start(); updateTitle(); }
  });
  // A poll says so with X-Skiplock-Poll: 1; the server does not count it as activity, so a tab
  // left open does not keep a sign-in alive past web.session_idle (console/web/auth.py).
  // A poll never swaps away what the operator is typing: while a field inside the polled element
  // has the focus, or holds text typed into it (a reason for an action, a filter), that
  // element's polls are skipped (marked data-poll-held) and resume once the field is left empty
  // and unfocused, or once the form's own request has swapped the fragment. A poll already on
  // its way when the typing began is answered but not swapped in (htmx:beforeSwap below).
  function typedIn(el) {
    var active = document.activeElement;
    if (active && active !== body && el.contains(active) && typing(active)) { return true; }
    return Array.prototype.some.call(el.querySelectorAll("input, textarea"), function (f) {
      var kind = (f.getAttribute("type") || "text").toLowerCase();
      if (f.tagName === "INPUT" && !/^(text|search|email|url|number|tel|password|datetime-local|date|time)$/.test(kind)) {
        return false;
      }
      return f.value !== f.defaultValue;
    });
  }
  document.addEventListener("htmx:configRequest", function (e) {
    var trigger = e.detail.triggeringEvent;
    if (!trigger || trigger.type !== "poll") { return; }
    var el = e.detail.elt || e.target;
    if (el && typedIn(el)) {
      el.setAttribute("data-poll-held", "");
      e.preventDefault();
      return;
    }
    if (el) { el.removeAttribute("data-poll-held"); }
    e.detail.headers["X-Skiplock-Poll"] = "1";
    // What the server last answered for this URL: a view built from the same collection cycle
    // comes back 304 with no body and nothing is swapped (console/web/cycle.py). Pages are
    // never stored by the browser (Cache-Control: no-store), so the tag is kept here.
    if (etags[e.detail.path]) { e.detail.headers["If-None-Match"] = etags[e.detail.path]; }
  });
  var etags = {};
  document.addEventListener("htmx:afterRequest", function (e) {
    var xhr = e.detail.xhr;
    var path = e.detail.requestConfig && e.detail.requestConfig.path;
    if (!xhr || !path || xhr.status !== 200 || xhr.skiplockNotShown) { return; }
    var tag = xhr.getResponseHeader("ETag");
    if (tag) { etags[path] = tag; } else { delete etags[path]; }
  });
  document.addEventListener("htmx:beforeSwap", function (e) {
    if (e.detail.xhr && e.detail.xhr.status === 304) {  // unchanged: keep what is shown
      e.detail.shouldSwap = false;
      e.detail.isError = false;
      return;
    }
    var config = e.detail.requestConfig;
    var trigger = config && config.triggeringEvent;
    var el = e.detail.target;
    if (trigger && trigger.type === "poll" && el && typedIn(el)) {
      el.setAttribute("data-poll-held", "");
      e.preventDefault();
      return;
    }
    // The answer to an operator's action (<p data-keep>: "pid 42 terminated") stays at least
    // KEEP_MS before a poll replaces the fragment it is in. A poll sent just before the action
    // and answered just after it would otherwise swap the answer away before it is read (seen
    // at load 10). The poll's answer is dropped and its ETag not kept: the next poll fetches anew.
    if (trigger && trigger.type === "poll" && el && answerShown(el)) {
      e.detail.shouldSwap = false;
      e.detail.xhr.skiplockNotShown = true;
    }
  });
  var KEEP_MS = 15000;
  function answerShown(el) {
    var kept = el.querySelector("[data-keep]");
    if (!kept) { return false; }
    var since = parseInt(kept.getAttribute("data-kept-since") || "0", 10);
    return !since || Date.now() - since < KEEP_MS;
  }
  document.addEventListener("htmx:afterSettle", function () {
    document.querySelectorAll("[data-keep]:not([data-kept-since])").forEach(function (k) {
      k.setAttribute("data-kept-since", String(Date.now()));
    });
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
  document.addEventListener("htmx:afterSettle", function () { updateTitle(); start(); });

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

  // Keyboard: "/" focuses the search box; "g" then a letter goes to a page (the links of
  // #shortcuts in base.html carry data-shortcut="g o" etc.: overview, queues, jobs, dead letters,
  // workers, alerts, advisor, maintenance); "j"/"k" move a highlight down and up the rows of the
  // page's tables and Enter (or "o") opens the highlighted row's first link; "?" shows the list,
  // Escape closes it (and clears the highlight). Nothing fires while typing in a field.
  var prefix = null;
  var rowIndex = -1;
  function rows() {
    return Array.prototype.filter.call(document.querySelectorAll("main table tbody tr"), function (tr) {
      return tr.offsetParent !== null && tr.querySelector("a[href]");
    });
  }
  function highlight(index) {
    var all = rows();
    document.querySelectorAll("tr.row-selected").forEach(function (tr) {
      tr.classList.remove("row-selected");
      tr.removeAttribute("aria-selected");
    });
    if (!all.length || index < 0) { rowIndex = -1; return; }
    rowIndex = Math.min(index, all.length - 1);
    var tr = all[rowIndex];
    tr.classList.add("row-selected");
    tr.setAttribute("aria-selected", "true");
    tr.scrollIntoView({block: "nearest"});
  }
  // A polled table is swapped for a fresh one: keep the highlight on the same position.
  document.addEventListener("htmx:afterSettle", function () { if (rowIndex >= 0) { highlight(rowIndex); } });
  function typing(el) {
    return el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
  }
  document.addEventListener("keydown", function (e) {
    if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) { return; }
    var help = document.getElementById("shortcuts");
    if (prefix) {
      var link = document.querySelector('a[data-shortcut="' + prefix + " " + e.key + '"]');
      prefix = null;
      if (link) { e.preventDefault(); window.location.assign(link.href); }
      return;
    }
    if (e.key === "Escape" && help && !help.hidden) { help.hidden = true; return; }
    if (e.key === "Escape" && rowIndex >= 0) { highlight(-1); return; }
    if (e.key === "j" || e.key === "k") {
      e.preventDefault();
      highlight(Math.max(rowIndex < 0 ? 0 : rowIndex + (e.key === "j" ? 1 : -1), 0));
      return;
    }
    // Enter on a focused link or button is theirs; otherwise it opens the highlighted row.
    var onControl = e.target.closest && e.target.closest("a, button");
    if ((e.key === "o" || (e.key === "Enter" && !onControl)) && rowIndex >= 0) {
      var selected = rows()[rowIndex];
      var target = selected && selected.querySelector("a[href]");
      if (target) { e.preventDefault(); window.location.assign(target.href); }
      return;
    }
    if (e.key === "/") {
      var box = document.querySelector("input[data-search]");
      if (box) { e.preventDefault(); box.focus(); box.select(); }
    } else if (e.key === "?") {
      if (help) { e.preventDefault(); help.hidden = !help.hidden; }
    } else if (e.key === "g") {
      prefix = "g";
      setTimeout(function () { prefix = null; }, 1500);
    }
  });
  document.addEventListener("click", function (e) {
    if (e.target.closest && e.target.closest("[data-close-shortcuts]")) {
      document.getElementById("shortcuts").hidden = true;
    }
  });

  updateTitle();
  start();
})();
