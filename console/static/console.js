// Counts remaining lease times down between refreshes: each [data-remaining-ms] cell
// gets a deadline on the browser's monotonic clock when it arrives (page or swap).
(function () {
  function arm(root) {
    root.querySelectorAll("[data-remaining-ms]").forEach(function (el) {
      el.dataset.deadline = String(performance.now() + Number(el.dataset.remainingMs));
    });
  }
  function tick() {
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var ms = Math.max(0, Number(el.dataset.deadline) - performance.now());
      el.textContent = (ms / 1000).toFixed(1) + " s";
    });
  }
  arm(document);
  document.body.addEventListener("htmx:afterSwap", function (e) { arm(e.target); });
  setInterval(tick, 200);
})();
