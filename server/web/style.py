"""The page's styles for the token view, the comparison and a stored rollout's request (page.py
holds the rest). Long tokens and lines wrap at the page's width: nothing runs off to the side."""

VIEW_CSS = """
.he-tcall { border: 1px solid #e5e7eb; border-radius: 6px; margin: 6px 0; padding: 4px 8px; }
.he-tcall > summary { cursor: pointer; font-size: 0.9rem; }
.he-tcall[data-trained="1"] > summary { border-left: 4px solid #16a34a; padding-left: 6px; }
.he-tcall[data-trained="0"] > summary { border-left: 4px solid #9ca3af; padding-left: 6px; }
.he-prompt { background: #f3f4f6; color: #374151; border-radius: 4px; padding: 4px 8px; margin: 4px 0; }
.he-prompt pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0 0 4px 0; font-size: 0.8rem; max-height: 240px; overflow-y: auto; }
.he-role { font-size: 0.75rem; font-weight: 600; text-transform: uppercase; opacity: 0.7; }
.he-part { display: block; font-size: 0.75rem; font-weight: 600; opacity: 0.7; font-family: var(--font); }
.he-untrained .he-tok { outline: 1px dashed #6b7280; }
.he-graph ul { margin: 0 0 8px 1.2em; font-size: 0.9rem; }
.he-compare { width: 100%; table-layout: fixed; border-collapse: collapse; font-size: 0.85rem; }
.he-compare th, .he-compare td { border-bottom: 1px solid #e5e7eb; padding: 4px 6px; vertical-align: top; text-align: left; }
.he-compare pre { white-space: pre-wrap; overflow-wrap: anywhere; max-height: 240px; overflow-y: auto; margin: 0; font-size: 0.8rem; }
.he-compare td.he-differs { background: #fef9c3; }
.he-compare thead th:first-child { width: 14%; }
.he-request pre { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 0.8rem; }
"""
