// The "Enqueue a job" form: the payload textarea must hold JSON before the form is sent.
// Loaded with <script src> (no inline script: the console's CSP allows scripts from 'self' only).
(function () {
  "use strict";
  function check(area) {
    var status = area.form.querySelector("[data-json-status]");
    var text = area.value.trim();
    var message = "";
    if (text) {
      try { JSON.parse(text); } catch (err) { message = "Payload is not valid JSON: " + err.message; }
    }
    area.setCustomValidity(message);
    if (status) {
      status.textContent = message || (text ? "Valid JSON." : "Empty: the payload will be {}.");
      status.className = message ? "bad" : "muted";
    }
    return !message;
  }
  document.querySelectorAll("textarea[data-json-editor]").forEach(function (area) {
    area.addEventListener("input", function () { check(area); });
    area.form.addEventListener("submit", function (e) {
      if (!check(area)) { e.preventDefault(); area.reportValidity(); area.focus(); }
    });
    check(area);
  });
})();
