"""The pass map: for each speculative pass under DCP, are the rows a pass READS the rows the write door WROTE?

For one sglang release (the tree on ``PYTHONPATH``), on CPU, with small pools:

1. tagged rows are written through the write door the backend really uses
   (``MLATokenToKVPool.set_mla_kv_buffer`` for an MLA target or NextN draft,
   ``MHATokenToKVPool.set_kv_buffer`` for a dense DSPARK draft's context, as
   ``models/dspark.py::write_target_hidden_kv`` does; ``TritonAttnBackend._set_kv_buffer``
   for the block tokens of a Triton draft);
2. for each pass, sglang's own metadata builders build the KV indices (the real
   attention backend object, built by its own ``__init__`` on a stand-in model
   runner, and its own ``init_forward_metadata*``). The only things replaced are
   the GPU pieces: the flashinfer wrapper classes are recorders (their ``plan``
   keeps the indices handed to the kernel; a CUDA-graph wrapper reads its bound
   buffer, as flashinfer's does), tensors asked for on ``cuda`` are made on CPU,
   and Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``);
3. each index the kernel would read is mapped to the physical row it touches,
   and the tag found there is compared with the tags of the tokens the pass
   must attend to (on a striped pool: this rank's share);
4. after a HiCache backup, scrub and load-back through the controller's own
   transfer pieces (``tools/emulation/datapath/layouts.py::host_stack`` and the
   ``HybridCacheController`` transfer lists), the reads are repeated.

Target backends: flashinfer MLA (``FlashInferMLAAttnBackend``, ``--attention-backend flashinfer`` on an MLA model)
and fa3 (``FlashAttentionBackend`` in its MLA mode, its rows = ``page_table`` x ``cache_seqlens``; ``sgl_kernel`` is
a stand-in module whose kernels raise if called). Releases 0.5.17 on: pools, write doors, read-id builders and
HiCache pieces are each release's own, called with the signatures that release has (see docs/spec-under-dcp.md).

The modules:

- ``harness``: the shared machinery (GPU stand-ins, tags and the judge, sglang's context per rank, the request, the
  passes' batches, the iteration's KVLocPlan, pools and write doors, the HiCache round trip);
- ``nextn``: the flashinfer-MLA passes (NEXTN's target and draft; every case's flashinfer-MLA target verify);
- ``fa3``: the fa3 target; ``dspark``: DSPARK's dense draft on each draft-backend flag (the flashinfer and
  trtllm_mha draft blocks on the real backend objects, eager and as a CUDA graph); ``eagle``: external EAGLE /
  EAGLE3 dense drafts; ``plain``: a plain launch's target passes (EXTEND, DECODE eager and CUDA graph, with the LSE
  the DCP merge needs), recorded under "plain";
- ``cases``: all the speculative cases; ``probes``: launches the release refuses before any pass runs, by its own
  check; ``fixed``: the verify with the fix (upstream-next 0012, the plugin's hooks), under "verify_fixed";
- ``report``: the full map (``spec_passes.json``), its freshness and the document's block; ``compact``: the
  package's per-release tables; ``controls``: the negative controls; ``cli``: the command.

Verdicts: "consistent", "wrong-rows", "raises", "not-admitted", "not-run".
Nothing is hard-coded: every verdict is what the run found.

Usage: PYTHONPATH=build/trees/sglang-X python -m emulation.passmap [--write | --check | --json]
       [--control shift-write,no-translate,shift-mha-write,no-lse [--check]]  (the negative controls, and the
       check, as one JSON line)
       [--fix plugin|upstream-next [--write | --check | --json]]  (the verify with the fix)
"""
