"""The page's styles: the classes the render modules give what they make. Long tokens and lines wrap
at the page's width: nothing runs off to the side."""

CSS = """
.he-reward { text-align: center; padding: 12px 8px; border-radius: 8px; min-width: 180px; }
.he-reward-label { display: block; font-size: 0.9rem; opacity: 0.8; }
.he-reward-value { display: block; font-size: 3rem; font-weight: 700; line-height: 1.1; }
.he-reward-error { font-size: 0.85rem; margin-top: 6px; word-break: break-word; }
.he-pass { background: #dcfce7; color: #166534; }
.he-fail { background: #fee2e2; color: #991b1b; }
.he-partial { background: #fef3c7; color: #92400e; }
.he-none { background: #f3f4f6; color: #4b5563; }
.he-table { width: 100%; border-collapse: collapse; font-size: 0.9rem; }
.he-table th, .he-table td { border-bottom: 1px solid #e5e7eb; padding: 4px 8px; text-align: left; vertical-align: top; }
.he-table tr.he-bad td.he-code { color: #b91c1c; font-weight: 600; }
.he-table tr.he-ok td.he-code { color: #15803d; font-weight: 600; }
.he-table pre, .he-file pre { max-height: 320px; overflow: auto; white-space: pre-wrap; font-size: 0.8rem; }
.he-empty { opacity: 0.7; font-style: italic; }
.he-images { display: flex; gap: 16px; flex-wrap: wrap; }
.he-images figure { margin: 0; text-align: center; }
.he-images img { width: 256px; height: 256px; object-fit: contain; border: 1px solid #e5e7eb; background: #fff; }
.he-trajectory pre { max-height: 120px; margin: 0; }
.he-trajectory-head { font-size: 0.9rem; opacity: 0.8; }
#phase-log textarea { font-family: var(--font-mono), monospace; font-size: 0.85rem; }
.he-reward-why { font-size: 0.9rem; margin-top: 6px; }
.he-json pre { max-height: 640px; overflow: auto; font-size: 0.8rem; }
.he-tokens { white-space: pre-wrap; overflow-wrap: anywhere; font-family: var(--font-mono), monospace; font-size: 0.8rem; line-height: 1.6; }
.he-tok { border-radius: 2px; color: #111; }
.he-tok:hover { outline: 1px solid #111; }
.he-chat-text { white-space: pre-wrap; word-break: break-word; }
.he-chat-code { white-space: pre-wrap; word-break: break-word; font-family: var(--font-mono), monospace; font-size: 0.85rem; margin: 0; }
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
