// MathJax for pymdownx.arithmatex (generic mode): $...$ and $$...$$ in pages and docstrings.
// MathJax itself ships with the site (javascripts/mathjax/tex-svg.js): SVG output, no web fonts.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  svg: {
    fontCache: "global"
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};
document$.subscribe(() => {
  MathJax.typesetPromise && MathJax.typesetPromise()
})
