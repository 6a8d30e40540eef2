// Renders the formulas of the site with the vendored KaTeX (docs/assets/vendor/katex), no
// network: pymdownx.arithmatex (generic mode) writes each formula as
// <span class="arithmatex">\( ... \)</span> or <div class="arithmatex">\[ ... \]</div>.
(function () {
  function render(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      if (el.dataset.katex) return;
      var tex = el.textContent.trim();
      var display = tex.startsWith("\\[");
      if (tex.startsWith("\\(") || display) tex = tex.slice(2, -2);
      katex.render(tex, el, { displayMode: display, throwOnError: false });
      el.dataset.katex = "1";
    });
  }
  if (typeof document$ !== "undefined") {
    document$.subscribe(function () { render(document.body); });
  } else {
    document.addEventListener("DOMContentLoaded", function () { render(document.body); });
  }
})();
