// Renders the formulas of the site with the vendored KaTeX (docs/assets/vendor/katex), no
// network: pymdownx.arithmatex (generic mode) writes each formula as
// <span class="arithmatex">\( ... \)</span> or <div class="arithmatex">\[ ... \]</div>.
// The search results hold the same formulas as plain text, \( ... \): drawn as they appear.
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
  var INLINE = /\\\((.+?)\\\)/g;
  function renderText(root) {
    var walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    var nodes = [];
    while (walker.nextNode()) {
      if (INLINE.test(walker.currentNode.nodeValue)) nodes.push(walker.currentNode);
      INLINE.lastIndex = 0;
    }
    nodes.forEach(function (node) {
      var span = document.createElement("span");
      span.innerHTML = node.nodeValue
        .split(INLINE)
        .map(function (part, i) {
          if (i % 2) return katex.renderToString(part, { throwOnError: false });
          var text = document.createElement("span");
          text.textContent = part;
          return text.innerHTML;
        })
        .join("");
      node.replaceWith(span);
    });
  }
  function watchSearch() {
    var list = document.querySelector(".md-search-result__list");
    if (!list) return;
    new MutationObserver(function () { renderText(list); }).observe(list, { childList: true, subtree: true });
  }
  function start() { render(document.body); }
  if (typeof document$ !== "undefined") {
    document$.subscribe(start);
  } else {
    document.addEventListener("DOMContentLoaded", start);
  }
  document.addEventListener("DOMContentLoaded", watchSearch);
})();
