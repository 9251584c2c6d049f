"""``context-assembly replay``: recorded agent conversations replayed through the service, with
the input tokens, cache reads and cache writes each provider's documented cache rules would give
for several policies side by side (docs/replay.md).

- ``rules``: the providers' cache rules, pure (a prompt as content blocks in, usage out);
- ``frames``: a provider request body as the content blocks the rules read, with their counts;
- ``synth``: kv-cache-tester traces rebuilt as conversations, text synthesised per block hash;
- ``logs``: JSON-lines conversation logs of provider request bodies;
- ``policies``: what each policy is and gives, and the policies run without the service;
- ``driver``: the service in-process, one pass per policy;
- ``report``: totals, the text table, JSON and the HTML page.
"""
