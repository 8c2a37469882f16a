"""Mutation check: every deliberate bug in MUTATIONS must make a named test fail on its assertion.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 CI=1 \
        .venv/bin/python tests/mutation_check.py [-k NAME] [--keep] [--timeout S] [--record]

For each mutation: copy the working tree (tracked and untracked, not ignored files) to a
temporary folder, apply the mutation's exact text replacements there (the checkout itself is
never touched), run the tests named as its catchers under a timeout, and read pytest's junit
XML. A mutation is caught only when a catcher FAILS ON AN ASSERTION (a <failure> whose message
is an assert, an AssertionError or pytest.fail / pytest.raises): an <error> (a fixture or
collection error), any other exception the mutated code raises, or a timeout is reported as
such and does not count. A replacement whose target text is not found exactly once stops the
run, naming the mutation (the code moved: update the list). The unmutated tree runs all the
chosen catchers first: every one must run and pass (none skipped, none missing), or no "caught"
means anything.

Prints a table (mutation -> outcome -> by which tests -> when) and exits non-zero if any
mutation is not caught. `--record` writes the rows into the table in docs/testing.md (date and
commit of this run). Not part of `make test` (minutes, not seconds); run it after every change
to the code a mutation targets. tests/project/test_mutation_targets.py checks on every `make test`
that each target text still exists, so this list cannot rot silently. Run it with OpenBLAS
preloaded (as `make test` does): several catchers are determinism tests that only bite with an
optimized BLAS (README, "Linux: OpenBLAS").
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EC = "tests/cache/test_prompt_cache_guarantees.py::"
DC = "tests/cache/test_disk_cache.py::"
PL = "tests/cache/test_cache_planner.py::"
FA = "tests/cache/test_cache_families.py::"
EP = "tests/engine/test_edge_promises.py::"
SS = "tests/engine/test_stop_strings.py::"
RE = "tests/serve/test_remote.py::"
BS = "tests/cache/test_block_store.py::"
MT = "tests/cache/test_memory_tier.py::"
RS = "tests/cache/test_restore_spare.py::"
RH = "tests/cache/test_reply_header_cuts.py::"
HF = "tests/cache/test_cache_files_hostile.py::"
DF = "tests/cache/test_disk_cache_faults.py::"
CO = "tests/engine/test_continue.py::"
FT = "tests/engine/test_free_text.py::"
KP = "tests/cache/test_kept_prefix.py::"
DO = "tests/engine/test_documents.py::"
DH = "tests/engine/test_documents_hostile.py::"
PP = "tests/engine/test_planted_promises.py::"
RP = "tests/engine/test_run_progress.py::"
MM = "tests/cache/test_memory_budget.py::"
LR = "tests/app/test_live_run.py::"
KEPT_WHILE_USED = "        return 1 if used is None or all(d in used for d in needed) else 0\n"
DOCS = ROOT / "docs" / "testing.md"
DEFAULT_TIMEOUT = 300  # seconds per pytest run of one mutant (the baseline: this per mutation)


@dataclass(frozen=True)
class Mutation:
    name: str
    edits: tuple[tuple[str, str, str], ...]  # (file, exact old text, new text)
    tests: tuple[str, ...]  # pytest node ids expected to catch it


MUTATIONS: list[Mutation] = [
    Mutation(
        "restore len instead of len-1",
        (("engine/cache/planner.py", "    limit = len(prompt) - 1\n", "    limit = len(prompt)\n"),
         # the loop's own guard goes too, or it alone would catch this
         ("engine/generate/loop.py", '    assert restored <= len(prompt) - 1, "never restore the whole prompt"\n', "")),
        (EC + "test_whole_prompt_hit_restores_len_minus_one_and_is_identical",  # its fast-mode cases
         PL + "test_plan_never_restores_the_whole_prompt"),
    ),
    Mutation(
        "drop the aligned chunking (no cuts at multiples of C)",
        (("engine/cache/planner.py", "    cuts = set(range(chunk, last, chunk))\n", "    cuts = set()\n"),),
        (EC + "test_exact_mode_multi_turn_equals_cold_with_cache_used",
         EC + "test_prefill_after_an_unaligned_restore_is_cut_at_absolute_multiples",
         EC + "test_whole_prompt_bug_reproduced_on_purpose",
         EC + "test_report_describes_layers_and_aligned_chunks",
         PL + "test_schedule_cuts_multiples_of_c_message_starts_and_the_last_token"),
    ),
    Mutation(
        "drop the message-boundary cuts",
        (("engine/cache/planner.py", "    cuts.update(m for m in message_starts if 0 < m < last)\n", ""),),
        (EC + "test_exact_mode_multi_turn_equals_cold_with_cache_used",
         EC + "test_report_describes_layers_and_aligned_chunks",
         PL + "test_schedule_cuts_multiples_of_c_message_starts_and_the_last_token"),
    ),
    Mutation(
        "drop the chunk size from the model key",
        (("engine/engine.py", '{**options, "chunk": self.chunk, "dequantized": dequantized, **sharding}',
          '{**options, "dequantized": dequantized, **sharding}'),),
        (DC + "test_one_cache_dir_two_chunk_sizes_never_share_snapshots",),
    ),
    Mutation(
        "drop the world size and sharding from the model key",
        (("engine/engine.py", '{**options, "chunk": self.chunk, "dequantized": dequantized, **sharding}',
          '{**options, "chunk": self.chunk, "dequantized": dequantized}'),),
        ("tests/serve/test_distributed.py::test_world_size_and_sharding_are_part_of_the_model_key",),
    ),
    Mutation(
        "trust the index's trimmable flag",
        (("engine/cache/disk/format.py", "    derived = trimmable(cache)\n",
          "    derived = meta.trimmable\n"),
         # the cut's own refusal goes too, or it alone would catch this (the mutation below)
         ("engine/cache/families.py", "        if not self.trimmable(c):\n", "        if False:\n")),
        (DC + "test_forged_trimmable_flag_never_allows_a_partial_restore",),
    ),
    Mutation(
        "cut back a layer that cannot be cut (a wrapped ring, SSM state)",
        (("engine/cache/families.py", "        if not self.trimmable(c):\n", "        if False:\n"),),
        (FA + "test_rotating_kv_cache_can_be_cut_until_its_window_wraps",
         FA + "test_arrays_cache_ssm_state_is_never_cut_and_has_no_offset"),
    ),
    Mutation(
        "a wrapped sliding window counts as trimmable",
        (("engine/cache/families.py", "trimmable=lambda c: c.offset < c.max_size,", "trimmable=_always,"),),
        (FA + "test_rotating_kv_cache_can_be_cut_until_its_window_wraps",
         EC + "test_uncuttable_cache_declined_never_partially_restored"),
    ),
    Mutation(
        "canonical length ignored: a fast restore's snapshots claim the whole schedule as exact",
        (("engine/generate/loop.py", "                exact_cuts = tuple(c for c in plan.meta.exact_cuts if c <= restored)\n",
          "                exact_cuts = cuts\n"),),
        (EC + "test_exact_regenerate_after_fast_mode_equals_cold",),
    ),
    Mutation(
        "reuse a fast-mode snapshot in exact mode (exact restores any matched point)",
        (("engine/cache/planner.py", '    if mode == "fast":\n', '    if mode in ("fast", "exact"):\n'),),
        (EC + "test_exact_mode_multi_turn_equals_cold_with_cache_used",
         EC + "test_exact_regenerate_after_fast_mode_equals_cold",
         PL + "test_reuse_point_exact_mode_falls_back_to_the_last_shared_cut"),
    ),
    Mutation(
        "exact at a shared cut whatever the cuts before it",
        (("engine/cache/planner.py", "    return mine == tuple(c for c in cuts if c <= reuse)\n",
          "    return reuse in cuts\n"),),
        (PL + "test_exact_at_only_where_both_schedules_made_the_same_cuts",),
    ),
    Mutation(
        "forget the pre-last snapshot",
        (("engine/generate/loop.py", "        prelast_now=prelast_due and not always_cut,\n", "        prelast_now=False,\n"),),
        (EC + "test_whole_prompt_hit_restores_len_minus_one_and_is_identical",),
    ),
    Mutation(
        "memory tier evicts first in, not least recently used",
        (("engine/cache/memory_tier.py", "            self._items.move_to_end(sid)\n", ""),),
        (EC + "test_memory_budget_evicts_least_recently_used",),
    ),
    Mutation(
        "a snapshot with a shorter exact history may replace one with a longer",
        (("engine/cache/planner.py", "    if a.exact_cuts[: len(b.exact_cuts)] != b.exact_cuts:\n        return False\n", ""),),
        (PL + "test_dominates_keeps_exact_states",),
    ),
    # -- around the core (issue 22): each target one line, each catcher a public-surface test ---------
    Mutation(
        "verify ignores the logprobs digest (tokens alone decide a match)",
        (("engine/receipts.py", "    ok = result.tokens == receipt.tokens and digest == receipt.logprobs_sha256\n",
          "    ok = result.tokens == receipt.tokens\n"),),
        (EP + "test_verify_fails_when_only_one_logprobs_low_bit_differs",),
    ),
    Mutation(
        "the server's cached_tokens reports the matched prefix, not what was restored",
        (("engine/serve/formats/chat.py", '"cached_tokens": result.report.restored}', '"cached_tokens": result.report.matched}'),),
        (EP + "test_server_cached_tokens_is_what_was_restored_not_what_matched",),
    ),
    Mutation(
        "the KV-quantization group size left out of the model key",
        (("engine/models/key.py", "    opts = {**engine_options(folder), **(options or {})}\n",
          '    opts = {k: v for k, v in {**engine_options(folder), **(options or {})}.items() if k != "kv_group_size"}\n'),),
        (EP + "test_kv_group_sizes_in_one_cache_dir_never_share_snapshots",),
    ),
    Mutation(
        "the memory tier returns snapshots of any model, not only the loaded one",
        (("engine/cache/memory_tier.py", ' for e in self._items.values() if model_key is None or e.meta.model_key == model_key]',
          ' for e in self._items.values()]'),),
        (EP + "test_two_models_in_one_engine_never_share_snapshots",),
    ),
    Mutation(
        "identical to an existing variant decided on tokens alone",
        (("app/core/store/session.py", "\n                    and m.logprobs == list(result.logprobs)):", "):"),),
        ("tests/app/test_regenerate_promises.py::test_a_regenerate_with_equal_tokens_but_other_logprobs_is_kept_as_a_variant",),
    ),
    Mutation(
        "the context check off by one (prompt + max_tokens may pass the context by one)",
        (("engine/generate/context.py", "    if limit is None or len(first.ids) + max_tokens <= limit:\n",
          "    if limit is None or len(first.ids) + max_tokens <= limit + 1:\n"),),
        (EP + "test_prompt_plus_max_tokens_equal_to_the_context_is_served_one_more_refused",),
    ),
    Mutation(
        "regenerate uses the Settings' current mode instead of the reply's own",
        (("app/core/store/session.py", "        mode = reply.report.mode if reply.report is not None else settings.mode\n"
          "        settings = replace(settings, sampler=sampler, mode=mode)\n",
          "        mode = settings.mode\n        settings = replace(settings, sampler=sampler, mode=mode)\n"),),
        ("tests/app/test_regenerate_promises.py::test_regenerate_repeats_the_replys_mode_whatever_the_settings_say",
         "tests/gui/test_regenerate.py::test_window_regenerate_runs_in_the_replys_mode_after_settings_changed"),
    ),
    Mutation(
        "the sampler reuses one random key for every step",
        (("engine/generate/sampling.py", "        self._key, step_key = mx.random.split(self._key)\n",
          "        step_key = self._key\n"),),
        (EP + "test_sampled_tokens_follow_the_documented_key_schedule",),
    ),
    Mutation(
        "stop strings not held back (the possible start of one is streamed)",
        (("engine/generate/stops.py", "        return text[: len(text) - self.held_back(text)]\n", "        return text\n"),),
        (SS + "test_the_reported_leak_is_gone",
         SS + "test_engine_streams_exactly_the_final_text_for_random_stop_strings"),
    ),
    Mutation(
        "attaching to a server drops the loaded engine before the server answers",
        (("engine/executor.py", "        new = make_engine()\n", "        self._engine = None\n        new = make_engine()\n"),),
        ("tests/gui/test_attached_to_server.py::test_a_server_that_cannot_be_reached_keeps_the_model_loaded",),
    ),
    Mutation(
        "a remote engine ignores the token ids the stream names (a stopped reply loses them)",
        (("engine/remote.py", '                    named = [int(t) for t in v.get("token_ids") or []]\n',
          "                    named = []\n"),),
        (RE + "test_remote_engine_streams_reports_per_rank_verifies_and_sees_the_server_go",),
    ),
    # issue 31: the key in the keyring, not settings.ini; the workflows' checks
    Mutation(
        "a key stored in the keyring is also written to settings.ini",
        (("app/core/engine_link/api_keys.py", '            settings.remove(FILE_SETTING)\n            return "keyring"\n',
          '            settings.setValue(FILE_SETTING, key)\n            return "keyring"\n'),),
        ("tests/app/test_api_keys.py::test_a_remembered_key_is_in_the_keyring_not_in_settings_ini_and_survives_a_restart",
         "tests/gui/test_attached_to_server.py::test_a_server_with_a_key_is_remembered_and_attached_again_at_the_next_start"),
    ),
    Mutation(
        "the migration copies the key into the keyring but leaves it in settings.ini",
        (("app/core/engine_link/api_keys.py", "    settings.remove(FILE_SETTING)\n    log.info(", "    log.info("),),
        ("tests/app/test_api_keys.py::test_a_key_in_settings_ini_moves_to_the_keyring_at_the_next_start",
         "tests/gui/test_attached_to_server.py::test_a_server_with_a_key_is_remembered_and_attached_again_at_the_next_start"),
    ),
    Mutation(
        "keyring's fail backend taken for a keyring (the dialog claims a keyring it does not have)",
        (("app/core/engine_link/api_keys.py", "(fail.Keyring, null.Keyring)", "(null.Keyring,)"),),
        ("tests/app/test_api_keys.py::test_without_a_keyring_the_key_stays_in_settings_ini_and_the_dialog_says_so",),
    ),
    Mutation(
        "the macOS job runs a narrower test command than the README's",
        ((".github/workflows/ci.yml", "        run: make test\n", "        run: make test ARGS=\"-m 'not slow'\"\n"),),
        ("tests/project/test_workflows.py::test_the_macos_job_runs_the_readmes_test_command_on_apple_silicon",),
    ),
    Mutation(
        "a checkout keeps the job's token in .git/config",
        ((".github/workflows/release.yml", "          persist-credentials: false\n      - uses: actions/setup-python",
          "          fetch-depth: 1\n      - uses: actions/setup-python"),),
        ("tests/project/test_workflows.py::test_actionlint_and_zizmor_find_nothing_in_the_workflows",),
    ),
    # issue 30: tools and structured output (the constraint in the receipt, the mask before sampling)
    Mutation(
        "a receipt leaves the constraint (tools, tool_choice, response_format) out",
        (("engine/receipts.py", "        constraint=request.constraint,\n        documents=", "        documents="),),
        ("tests/engine/test_constraints.py::test_a_constrained_receipt_verifies_and_a_tampered_one_is_refused",),
    ),
    Mutation(
        "the grammar's mask applied after sampling (to the reported logprobs) instead of before",
        (("engine/generate/sampling.py", "        out.append(lambda tokens, logits: masked(logits, mask()))\n", "        pass\n"),
         ("engine/generate/loop.py", "        token, logprob, dist = sampler.sample(logits, history)\n",
          "        token, logprob, dist = sampler.sample(logits, history)\n"
          "        if guide is not None:\n"
          "            dist = mx.where(guide.mask(), dist, -float('inf'))\n"
          "            logprob = mx.take_along_axis(dist, token[:, None], axis=-1)[0, 0]\n")),
        ("tests/engine/test_constraints.py::test_the_mask_holds_under_every_sampler_setting",),
    ),
    # issue 29: the server and the cluster under an attacker (guard, keys, connections, admission, ranks)
    Mutation(
        "the Host check lets any IP literal through",
        (("engine/serve/guard.py", "        return local_ip is not None and _same_ip(name, local_ip)\n",
          "        return True\n"),),
        ("tests/serve/test_server_guard.py::test_a_dns_rebinding_host_is_refused_and_loopback_names_are_served",
         "tests/serve/test_server_guard.py::test_origin_and_host_rules_as_plain_functions"),
    ),
    Mutation(
        "the Origin of a web page is not checked",
        (("engine/serve/guard.py", "        if origin is not None and not self.origin_allowed(origin):\n",
          "        if False:\n"),),
        ("tests/serve/test_server_guard.py::test_a_web_pages_simple_cross_origin_post_is_refused_before_any_work",),
    ),
    Mutation(
        "a POST body of any content type is read",
        (("engine/serve/guard.py", '            if ctype != "application/json":\n', "            if False:\n"),),
        ("tests/serve/test_server_guard.py::test_a_web_pages_simple_cross_origin_post_is_refused_before_any_work",),
    ),
    Mutation(
        "every API key shares one cache namespace",
        (("engine/serve/keys.py",
          '        return "key:" + hashlib.sha256(match.encode("utf-8", "surrogateescape")).hexdigest()\n',
          "        return API_NAMESPACE\n"),),
        ("tests/serve/test_server_privacy.py::test_two_keys_never_see_each_others_cache_in_memory_or_on_disk",),
    ),
    Mutation(
        "the half-open (slow request) timeout is never applied",
        (("engine/serve/connections.py",
          "            if c.phase == RECEIVING and not c.complete and now - c.since > self.limits.request_timeout:\n",
          "            if False:\n"),),
        ("tests/serve/test_server_guard.py::test_partly_sent_requests_and_idle_connections_are_closed",),
    ),
    Mutation(
        "bytes waiting unread never peeked, taken for a whole request: the newcomer of a burst is dropped",
        (("engine/serve/connections.py",
          "    if n <= 0:\n        return NOTHING\n",
          "    if n <= 0:\n        return NOTHING\n    return WHOLE\n"),),
        ("tests/serve/test_server_guard.py::"
         "test_a_whole_request_in_one_accept_burst_with_more_half_open_ones_than_the_cap_is_answered",),
    ),
    Mutation(
        "the ranks do not agree on one restore point",
        (("engine/distributed/agree.py", "            if low == high:\n", "            if True:\n"),),
        ("tests/serve/test_distributed.py::test_two_ranks_exact_cache_restart_and_lost_snapshots",),
    ),
    Mutation(
        "tokenize bypasses the admission queue",
        (("engine/serve/generation.py", "    ticket = Ticket(state, served.key, False)\n",
          "    ticket = Ticket(type(state)(1 << 20), served.key, False)\n"),),
        ("tests/serve/test_server_hardening.py::test_tokenize_waits_its_turn_in_the_queue_and_is_not_killed_as_slow",),
    ),
    # issue 28: the window's truth (the run shown, Send against the meter, drafts, the GUI thread)
    Mutation(
        "the run shown is not the one selected (the debug panel shows the latest run)",
        (("app/core/conversation/view_models.py", "    if run is None and vm.shown is not None:\n        run = vm.runs[vm.shown]\n", ""),),
        ("tests/gui/test_reply_report.py::test_the_run_picked_in_the_runs_menu_is_the_one_the_footer_badge_and_debug_panel_show",),
    ),
    Mutation(
        "Send enabled (and sending) on a send the meter refuses",
        (("app/core/composer/model.py",
          "        if b is None or not b.refused or not self.counted(text):\n",
          "        if True:\n"),),
        ("tests/gui/test_composer.py::test_a_send_the_meter_refuses_is_disabled_and_never_touches_the_conversation",),
    ),
    Mutation(
        "a draft not saved at close",
        (("app/qt/window/window.py", "        self.chat.composer.save()  # what was typed and not sent is there at the next start\n",
          ""),),
        ("tests/gui/test_composer.py::test_drafts_are_stored_with_their_conversation_and_restored_at_start",),
    ),
    Mutation(
        "the GUI thread waits on the engine job of a reply",
        (("engine/bridge.py", "    executor.submit(run).add_done_callback(finished)\n",
          "    job = executor.submit(run)\n    job.add_done_callback(finished)\n    job.exception()\n"),),
        ("tests/gui/test_replies.py::test_gui_thread_never_waits_on_the_engine_during_generation",),
    ),
    # issue 27: the block store (blocks named by their history, shared, freed, committed in order)
    Mutation(
        "a block keyed without its cut history (the forwards that computed it)",
        (("engine/cache/blocks.py", "list(meta.tokens[a:b]), forwards_of(meta.forwards, a, b)]",
          "list(meta.tokens[a:b]), []]"),),
        (BS + "test_block_names_chain_tokens_history_and_key",
         BS + "test_exact_and_decoded_blocks_of_the_same_tokens_are_kept_apart"),
    ),
    Mutation(
        "a block keyed without the namespace",
        (("engine/cache/blocks.py", 'root.update(env.encode() + b"\\0" + meta.model_key.encode() + b"\\0")',
          'root.update(env.encode() + b"\\0" + meta.model_key.split("-ns-")[0].encode() + b"\\0")'),),
        (BS + "test_block_names_chain_tokens_history_and_key",
         BS + "test_two_namespaces_never_share_blocks"),
    ),
    Mutation(
        "a block freed while a snapshot still uses it",
        (("engine/cache/disk/index.py", "            for users in self._users.values():\n                users.discard(sid)\n",
          "            for users in self._users.values():\n                if sid in users:\n                    users.clear()\n"),),
        (BS + "test_a_block_shared_by_two_snapshots_outlives_the_one_removed",),
    ),
    Mutation(
        "a manifest committed before its blocks are on disk",
        (("engine/cache/disk/store.py", "            packs = [self.files.write(snap, row, written) for row in rows]\n"
          "            commit(packs)\n",
          "            commit(rows)\n            packs = [self.files.write(snap, row, written) for row in rows]\n"),),
        (DC + "test_sigkill_while_writing_leaves_consistent_cache",),
    ),
    # issue 27 (reply header cuts): each earlier reply's header is forwarded as its own turn did
    Mutation(
        "drop the reply header cuts from the schedule",
        (("engine/cache/planner.py", "    cuts.update(h for h in reply_header_cuts if 0 < h < last)\n", ""),),
        (RH + "test_the_schedule_cuts_where_each_earlier_turns_prompt_ended_but_its_last_token",
         RH + "test_every_earlier_turns_regenerate_point_is_stored_once_on_disk",
         RH + "test_exact_follow_ups_restore_the_previous_regenerate_point_and_equal_cold"),
    ),
    Mutation(
        "no reply header cut found (the turn's prompt never compared with this one)",
        (("engine/generate/templating.py", "                out.append(len(ids) - 1)\n", "                pass\n"),),
        (RH + "test_reply_header_cuts_only_where_the_turns_prompt_is_a_prefix",
         RH + "test_every_earlier_turns_regenerate_point_is_stored_once_on_disk"),
    ),
    # issue 27: a regenerate's restore takes over the reply's live cache (no copy before its first forward)
    Mutation(
        "the restore ignores the spare and copies first",
        (("engine/cache/prompt_cache.py", "                spare = self._take_spare(plan.meta.id)\n",
          "                spare = self._take_spare(plan.meta.id) and None\n"),),
        (RS + "test_regenerate_hands_over_the_spare_and_keeps_the_snapshot_bits",),
    ),
    Mutation(
        "the spare handed over at its full length, not cut back",
        (("engine/cache/memory_tier.py", "                    ready.offset = n\n", "                    pass\n"),),
        (RS + "test_regenerate_hands_over_the_spare_and_keeps_the_snapshot_bits",),
    ),
    Mutation(
        "the spare of another snapshot handed over",
        (("engine/cache/prompt_cache.py", "return spare[1] if spare is not None and spare[0] == snapshot_id else None",
          "return spare[1] if spare is not None else None"),),
        (RS + "test_spare_serves_a_cut_back_restore_and_never_another_snapshot",),
    ),
    Mutation(
        "the spare kept whatever the memory budget has left",
        (("engine/cache/prompt_cache.py", "        if not arrays or sum(a.nbytes for a in arrays) > self.memory.room():\n",
          "        if not arrays:\n"),),
        (RS + "test_no_spare_where_the_memory_budget_has_no_room_for_it",),
    ),
    # issue 27 (memory tier): snapshots in memory over shared blocks
    Mutation(
        "a memory block freed while another snapshot still names it",
        (("engine/cache/memory_tier.py", "            if left > 0:\n", "            if False:\n"),),
        (MT + "test_a_block_shared_by_two_snapshots_outlives_the_one_dropped",),
    ),
    Mutation(
        "the memory budget counts a shared pack once per block, not once",
        (("engine/cache/memory_tier.py", "                if blk.pack.n_blocks == 0:\n                    self._bytes += blk.pack.nbytes\n",
          "                self._bytes += blk.pack.nbytes\n"),),
        (MT + "test_four_variants_hold_their_shared_prefix_once",),
    ),
    # issue 36: tools and formats together as OpenAI defines them (tests/serve/test_server_agents.py)
    Mutation(
        "$ref resolved against the wrapper (a tool's parameters inside the {name, arguments} schema)",
        (("engine/generate/constraints.py",
          '                bodies.append(f\'{json.dumps(head)} args{i} "}}"\')\n',
          '                rules[-1] = f"args{i}: " + _json_rule({"type": "object", "properties": {"name": {"const": name}, '
          '"arguments": params}, "required": ["name", "arguments"], "additionalProperties": False}, False)\n'
          '                bodies.append(f"args{i}")\n'),),
        ("tests/serve/test_server_agents.py::test_a_ref_in_a_forced_tools_parameters_resolves_against_that_schema",),
    ),
    Mutation(
        "the chat view builds every message's widget (virtualization off)",
        (("app/qt/conversation/chat_view.py", "VIRTUALIZE = True  #", "VIRTUALIZE = False  #"),),
        ("tests/gui/test_long_conversation.py::test_a_long_conversation_builds_only_the_messages_near_the_viewport",),
    ),
    Mutation(
        "the grammar cache shared across namespaces",
        (("engine/generate/constraints.py", "json.dumps([namespace, constraint.identity()])",
          "json.dumps([None, constraint.identity()])"),),
        ("tests/serve/test_server_agents.py::test_compiled_grammars_are_cached_per_api_key",
         "tests/engine/test_constraints.py::test_grammars_are_cached_per_namespace_and_within_a_byte_budget"),
    ),
    Mutation(
        "a named tool_choice allowing a second call",
        (("engine/generate/constraints.py", '            many = c.tool_choice != "function" and c.parallel_tool_calls\n',
          "            many = c.parallel_tool_calls\n"),),
        ("tests/serve/test_server_agents.py::test_a_named_choice_is_exactly_one_call_even_with_parallel_calls_allowed",),
    ),
    Mutation(
        "a call cut by max_tokens before its name was whole returned as content (its markup)",
        (("engine/serve/reply.py", '            self._end_open_call(out, cut=finish in ("length", "context"))\n',
          "            self._end_open_call(out, cut=False)\n"),),
        ("tests/serve/test_server_agents.py::test_a_cut_call_is_a_tool_call_with_partial_arguments_and_finish_length",
         "tests/serve/test_server_tools.py::test_reader_returns_a_cut_call_as_a_call_and_never_its_markup_as_content"),
    ),
    # issue 47: three wire formats over one generation path
    Mutation(
        "tool-call arguments come whole at the call's end, not as they are decoded",
        (("engine/serve/reply.py", "        if len(value) > len(c.sent):\n", "        if False:\n"),),
        ("tests/serve/test_agent_clients.py::"
         "test_openai_tutorial_loop_sends_model_dump_back_with_names_and_streams_argument_fragments",
         "tests/serve/test_server_agents.py::test_a_cut_call_is_a_tool_call_with_partial_arguments_and_finish_length"),
    ),
    Mutation(
        "a Responses function_call is a message of its own, not the reply's text's (another prompt)",
        (("engine/serve/formats/responses.py",
          '            if last is not None and last["role"] == "assistant":', "            if False:"),),
        ("tests/serve/test_server_formats.py::test_one_conversation_renders_the_same_prompt_through_all_three_formats",),
    ),
    Mutation(
        "Anthropic's usage counts no prompt tokens as newly stored",
        (("engine/serve/report.py", "    created = max(0, min(prompt, covered) - r.restored)\n",
          "    created = 0\n"),),
        ("tests/serve/test_server_formats.py::test_anthropic_usage_split_stop_reasons_and_the_seed_of_the_server",),
    ),
    Mutation(
        "a remote engine leaves the sampler's logit_bias out of its request",
        (("engine/remote.py", '        body["logit_bias"] = {str(token): bias for token, bias in s.logit_bias}\n',
          "        pass\n"),),
        ("tests/serve/test_remote.py::test_remote_engine_streams_reports_per_rank_verifies_and_sees_the_server_go",),
    ),
    Mutation(
        "a Responses chain forgets the files its earlier inputs attached",
        (("engine/serve/formats/responses.py", "    for f in [*(previous.files if previous is not None else ()), *p.files]:\n",
          "    for f in p.files:\n"),),
        ("tests/serve/test_server_formats.py::test_a_responses_chain_keeps_the_files_its_first_input_attached",),
    ),
    # issue 37: cache files that cannot hurt
    Mutation(
        "the index read through a symlink",
        (("engine/cache/disk/files.py", 'flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | ', "flags = os.O_RDONLY | "),),
        (HF + "test_generate_on_a_hostile_cache_answers_like_a_cold_run_and_names_the_loss[index_link]",),
    ),
    Mutation(
        "eviction before a save reserves the blocks' bytes, not the whole layers'",
        (("engine/cache/disk/store.py", "        self.evict(incoming_bytes(snap, rows))\n",
          "        self.evict(sum(nb for r in rows for _, _, nb in r.block_rows))\n"),),
        (DF + "test_eviction_before_a_save_makes_room_for_its_whole_layers_too",),
    ),
    Mutation(
        "a failure on the memory side of a restore deletes the disk entry",
        (("engine/cache/prompt_cache.py", "                if self.memory.touch(plan.meta.id):\n                    self.memory.drop(plan.meta.id)\n",
          "                if self.disk is not None:\n                    self.disk.remove(plan.meta.id)\n"),),
        (DF + "test_a_memory_side_failure_forgets_the_memory_copy_and_keeps_the_disk_entry",),
    ),
    Mutation(
        "a KV layer without keys kept in blocks by the writer",
        (("engine/cache/disk/plan.py", "    blocked = snap.layers_in_blocks()\n",
          "    from engine.cache.families import rules_of\n    blocked = [rules_of(c).blocks for c in snap.cache]\n"),),
        (DF + "test_a_kv_layer_without_keys_is_whole_in_both_tiers",),
    ),
    Mutation(
        "a lost pack not reported",
        (("engine/cache/disk/tier.py", "        if read.lost:\n", "        if False:\n"),),
        (HF + "test_generate_on_a_hostile_cache_answers_like_a_cold_run_and_names_the_loss[deleted_pack]",
         HF + "test_generate_on_a_hostile_cache_answers_like_a_cold_run_and_names_the_loss[truncated_pack]"),
    ),
    # issue 48: the disk tier's owners (a typed missing pack; what the index shares with its views is frozen)
    Mutation(
        "a reader keeps the blocks before a damaged pack, as if the pack were gone",
        (("engine/cache/disk/reader.py", "            except PackMissing as e:\n", "            except SnapshotError as e:\n"),),
        (BS + "test_a_reader_declines_a_snapshot_whose_later_pack_is_damaged_not_gone",),
    ),
    Mutation(
        "a use changes the entry in place, under the views that share it",
        (("engine/cache/disk/index.py", "        self._entries[sid] = replace(e, last_used=at)\n",
          "        object.__setattr__(e, \"last_used\", at)\n"),),
        ("tests/cache/test_disk_ownership.py::test_what_the_index_shares_with_its_views_is_frozen_and_a_use_replaces_the_entry",),
    ),
    # issue 39: Continue goes on with the unstopped run's key schedule
    Mutation(
        "Continue restarts the sampler's key schedule",
        (("engine/generate/loop.py", "    sampler = Sampler(settings, start=earlier,\n", "    sampler = Sampler(settings,\n"),),
        (CO + "test_continue_equals_the_unstopped_reply[sampled-stopped]",
         CO + "test_continue_without_a_snapshot_recomputes_with_the_same_forwards[sampled]"),
    ),
    # issue 39: a regenerate shown at once is still proved by its recomputation
    Mutation(
        "the replay skips the recomputation",
        (("app/core/generation/replay.py", "    return Replay(expected)\n",
          "    return Replay(expected, verified=len(expected.tokens), seen=len(expected.tokens), ended=True)\n"),),
        ("tests/gui/test_regenerate_replay.py::test_a_regenerate_shows_the_reply_at_once_and_verifies_it_as_it_is_recomputed",),
    ),
    # issue 39: a search hit in the open conversation is scrolled to
    Mutation(
        "search hit not scrolled into view",
        (("app/qt/conversation/chat_view.py",
          "        self._revealing = message_id  # the messages above may still grow as they lay out: follow it\n"
          "        self._settle()  # geometry up to date before scrolling to it\n"
          "        self._show_hit(w)\n",
          "        self._settle()  # geometry up to date before scrolling to it\n"),),
        ("tests/gui/test_conversations.py::"
         "test_a_search_hit_in_the_open_conversation_is_scrolled_to_and_marked_until_the_next_action",),
    ),
    # issue 38: documents read once
    Mutation(
        "a document placed after the first user message (not shared)",
        (("engine/documents/placement.py", "    blocks = SEPARATOR.join(block(d) for d in documents)\n",
          "    blocks = SEPARATOR.join(block(d) for d in documents)\n"
          "    at = next((i for i, m in enumerate(out) if m.get(\"role\") == \"user\"), len(out) - 1)\n"
          "    out[at] = {**out[at], \"content\": out[at][\"content\"] + SEPARATOR + blocks}\n"
          "    return out\n"),),
        (DO + "test_a_new_conversation_about_the_same_document_restores_it_and_equals_a_cold_run",
         DO + "test_documents_go_at_the_end_of_the_system_message_in_attach_order"),
    ),
    Mutation(
        "a document's cut dropped",
        (("engine/generate/prepare.py", "            starts = sorted(set(starts) | {s.end for s in spans if s.cut})\n",
          "            starts = sorted(set(starts))\n"),),
        (DO + "test_the_first_of_two_documents_is_shared_with_a_conversation_about_it_alone",
         DO + "test_a_cache_that_cannot_be_cut_back_shares_the_document_through_its_snapshot[gemma3]"),
    ),
    Mutation(
        "the document's digest left out of the receipt",
        (("engine/receipts.py", '{**doc.to_dict(), "text_sha256": doc.text_digest}',
          '{**{k: v for k, v in doc.to_dict().items() if k != "digest"}, "text_sha256": doc.text_digest}'),),
        (DO + "test_a_receipt_records_the_documents_and_verify_replays_it",),
    ),
    Mutation(
        "eviction drops a document's state like any turn",
        (("engine/cache/eviction.py", KEPT_WHILE_USED, "        return 0\n"),),
        (DO + "test_eviction_keeps_the_document_ahead_of_ordinary_turns",),
    ),
    Mutation(
        "eviction keeps a document's state that no conversation has any more",
        (("engine/cache/eviction.py", KEPT_WHILE_USED, "        return 1\n"),),
        (DO + "test_a_document_no_conversation_has_any_more_is_evicted_like_a_turn",),
    ),
    Mutation(
        "the window's reply is generated without the message's documents",
        (("app/core/store/session.py", "                                    documents=self.store.documents_for_prompt(user_id))",
          "                                    documents=())"),),
        ("tests/gui/test_documents.py::test_attach_by_button_shows_name_pages_and_tokens_and_a_chip_can_be_removed_before_sending",
         "tests/gui/test_documents.py::test_regenerate_about_a_document_is_identical_and_a_new_conversation_restores_it"),
    ),
    Mutation(
        "an edit of a message drops its documents",
        (("app/core/store/conversations.py", "            self._copy_documents(old.id, edited.id)", "            pass"),),
        ("tests/gui/test_documents.py::test_an_edit_keeps_the_documents_and_export_import_carries_them",),
    ),
    Mutation(
        "no document snapshot where the system message ends (a new conversation forwards its closing first)",
        (("engine/generate/prepare.py", "        points[system_end] = tuple(d.digest for d in spans)\n", "        pass\n"),),
        (DO + "test_a_document_snapshot_is_kept_where_the_next_message_starts_too",
         DO + "test_after_a_restart_the_documents_states_are_preloaded_and_the_first_question_reads_no_disk"),
    ),
    Mutation(
        "the read-ahead keeps no restored copy at hand (the first question copies the state)",
        (("engine/cache/prompt_cache.py",
          "            self.keep_spare(out[0], self.memory.cache_of(out[0]))\n",
          "            pass\n"),),
        (DO + "test_after_a_restart_the_documents_states_are_preloaded_and_the_first_question_reads_no_disk",),
    ),
    Mutation(
        "a tie ignores the copy at hand",
        (("engine/cache/planner.py", "o.meta.id == ready", "False"),),
        (PL + "test_a_tie_goes_to_the_snapshot_whose_copy_is_at_hand",),
    ),
    # issue 49: files that cannot hurt the server, documents read whole
    Mutation(
        "a tracked insertion dropped from a Word document",
        (("engine/documents/word.py", '_SKIPPED = frozenset({"w:del", ', '_SKIPPED = frozenset({"w:ins", "w:del", '),),
        (DH + "test_every_word_construct_is_read_as_word_shows_it",),
    ),
    Mutation(
        "binary content looked for in the first block of a text file only",
        (("engine/documents/extract.py", '    if "\\x00" in text:\n', '    if "\\x00" in text[:BINARY_BLOCK]:\n'),
         ("engine/documents/extract.py", "    for at in range(0, len(text), BINARY_BLOCK):\n",
          "    for at in range(0, min(len(text), 1), BINARY_BLOCK):\n")),
        (DH + "test_binary_content_is_found_anywhere_in_the_file",),
    ),
    Mutation(
        "a reader's page clock not watched (PDFium parses a hostile page as long as it likes)",
        (("engine/documents/bounded.py", "if stepped is not None and now - stepped > limits.page_seconds:",
          "if False:"),),
        (DH + "test_each_hostile_file_is_refused_within_the_limits",),
    ),
    Mutation(
        "a document's span counted with the markers typed in it as control tokens",
        (("engine/generate/prepare.py", "        return encode_prefix(self.lm.tokenizer, text, content_at)\n",
          "        return self.lm.tokenizer.encode(text, add_special_tokens=False)\n"),),
        (DH + "test_a_document_holding_control_token_text_is_reported_with_its_true_span",),
    ),
    Mutation(
        "engine serve reads only the window's namespace ahead",
        (("engine/engine.py", "(lambda k: is_key_of(lm.key, k)) if every_namespace else", "(lambda k: k == own) if True else"),),
        (DH + "test_engine_serve_reads_every_api_namespace_s_documents_ahead",),
    ),
    Mutation(
        "a selected search result drawn in the palette's highlighted text (white on the pale selection)",
        (("app/qt/conversation/sidebar.py",
          "        ctx.palette.setColor(QPalette.ColorRole.Text, opt.palette.color(QPalette.ColorRole.Text))\n",
          "        ctx.palette.setColor(QPalette.ColorRole.Text, opt.palette.color(QPalette.ColorRole.HighlightedText))\n"),),
        ("tests/gui/test_conversations.py::test_a_selected_search_result_is_drawn_readably_on_the_selection",),
    ),
    Mutation(
        "stop strings searched in a reply decoded under a grammar (they cut a forced call or a JSON value)",
        (("engine/generate/stops.py", "    if constrained:\n        return StopStrings(())\n", "    pass\n"),),
        (FT + "test_a_stop_string_never_cuts_a_forced_tool_call",
         FT + "test_a_stop_string_never_cuts_a_constrained_value"),
    ),
    Mutation(
        "stop strings searched inside an unforced tool call",
        (("engine/generate/stops.py", "        calls = (tokenizer.tool_call_start, tokenizer.tool_call_end)\n",
          "        calls = None\n"),),
        (FT + "test_a_stop_string_inside_an_unforced_call_does_not_end_the_reply",),
    ),
    Mutation(
        "a possible call marker's start is streamed before it is known (a stop string there cuts sent text)",
        (("engine/generate/stops.py", "        keep = self._marker_start(text)\n", "        keep = 0\n"),),
        (FT + "test_stop_strings_apply_around_calls",
         FT + "test_stop_strings_outside_calls_match_a_plain_search_and_stream_whole"),
    ),
    Mutation(
        "a sampled control token is decoded as text",
        (("engine/generate/loop.py", "    text = TextStream(lm.tokenizer, set(lm.no_text))\n",
          "    text = TextStream(lm.tokenizer, set(lm.eos_ids))\n"),),
        (FT + "test_a_sampled_control_token_is_left_out_of_the_text_and_kept_in_the_tokens",),
    ),
    Mutation(
        "only the end tokens end a reply (a sampled <|endoftext|> or <|im_start|> goes on)",
        (("engine/generate/loop.py", "        if token in ends:", "        if token in lm.eos_ids:"),),
        (FT + "test_a_sampled_turn_token_ends_the_reply_as_no_text",),
    ),
    Mutation(
        "a long system turn without documents is not kept (a harness's next session prefills it again)",
        (("engine/generate/prepare.py",
          "(system_end > spans[-1].end if spans else system_end >= KEPT_SYSTEM_MIN)",
          "(system_end > spans[-1].end if spans else False)"),),
        (KP + "test_a_second_session_restores_the_system_turn",
         KP + "test_after_a_restart_the_system_turn_is_read_ahead"),
    ),
    # issue 50: the window, round four
    Mutation(
        "an open editor counts as open only while shown (a second move of the window drops it, and its text)",
        (("app/qt/conversation/chat_view.py", "        return w.streaming or w.editing or ",
          "        return w.streaming or w.editor.isVisible() or "),),
        ("tests/gui/test_long_conversation.py::"
         "test_an_open_editor_keeps_its_text_while_its_message_is_scrolled_far_out_of_the_window",),
    ),
    Mutation(
        "a search hit's message is brought into view, not its line (a tall message is centred)",
        (("app/qt/conversation/chat_view.py", "        line = w.body.hit_line()\n", "        line = None\n"),),
        ("tests/gui/test_conversations.py::"
         "test_a_search_hit_in_a_message_taller_than_the_window_shows_the_hits_own_line[0]",),
    ),
    Mutation(
        "a message's text keeps PageUp / PageDown / Home / End (the conversation does not scroll from there)",
        (("app/qt/conversation/message_widget.py",
          "        if scrolls_the_conversation(event):\n"
          "            event.ignore()  # up to the conversation (ChatView.keyPressEvent), as a page's text does\n",
          "        if False:\n            event.ignore()\n"),),
        ("tests/gui/test_xcb.py::test_window_under_xvfb_with_the_xcb_platform",),
    ),
    Mutation(
        "a send with documents does not wait for the count of this very draft (saved, then refused)",
        (("app/core/ops.py", "    if c.must_count(text):  # documents go with it", "    if False:  # documents go with it"),),
        ("tests/gui/test_documents.py::test_a_draft_whose_documents_cannot_fit_is_refused_before_anything_is_saved"
         "_however_it_is_sent[enter after its chip shows the count]",
         "tests/app/test_chat_model.py::test_a_send_whose_documents_cannot_fit_is_refused_before_anything_is_saved"),
    ),
    Mutation(
        "a send does not wait for a file still being read (it goes without it)",
        (("app/core/composer/model.py",
          "        documents = self.attachments.documents or self.conversation.path_documents() or self.attachments.reading\n",
          "        documents = self.attachments.documents or self.conversation.path_documents()\n"),),
        ("tests/gui/test_documents.py::test_a_draft_whose_documents_cannot_fit_is_refused_before_anything_is_saved"
         "_however_it_is_sent[enter while the file is read]",
         "tests/app/test_chat_model.py::test_a_send_whose_documents_cannot_fit_is_refused_before_anything_is_saved"),
    ),
    Mutation(
        "every reply that starts scrolls to the bottom (a regenerate in the middle jumps away)",
        (("app/qt/conversation/chat_view.py", "        if pending.action in (Action.SEND, Action.RETRY):\n",
          "        if True:\n"),),
        ("tests/gui/test_long_conversation.py::"
         "test_variants_regenerate_continue_and_edit_keep_a_far_reply_where_it_is_on_screen",),
    ),
    Mutation(
        "the meter keeps the previous conversation's (or the old branch's) count until the new one",
        (("app/core/composer/model.py",
          "        if self.budget_for is not None and not self._continues(self.budget_path):\n",
          "        if False:\n"),),
        ("tests/gui/test_composer.py::"
         "test_the_meter_never_shows_another_conversations_count_nor_the_old_branchs_during_an_edit",
         "tests/app/test_chat_model.py::test_the_count_told_is_never_another_conversations_nor_an_old_branchs"),
    ),
    Mutation(
        "a chip counts its document alone (not where it is placed: the separator before it left out)",
        (("app/core/composer/model.py", "        if document.digest not in digests:\n", "        if True:\n"),),
        ("tests/gui/test_documents.py::"
         "test_attach_by_button_shows_name_pages_and_tokens_and_a_chip_can_be_removed_before_sending",),
    ),
    Mutation(
        "the window's local server starts without the settings' seed (a fresh one per request)",
        (("app/qt/engine_link/server_toggle.py", "share_window_cache=self.share_action.isChecked(), seed=self.seed())",
          "share_window_cache=self.share_action.isChecked())"),),
        ("tests/gui/test_server_toggle.py::"
         "test_the_local_server_starts_as_engine_serve_would_with_the_settings_seed_and_the_templates_options",),
    ),
    Mutation(
        "the window's local server ignores the options the model's template reads",
        (("app/qt/engine_link/server_toggle.py", "chunk=chunk, template_reads=template_reads)", "chunk=chunk)"),),
        ("tests/gui/test_server_toggle.py::"
         "test_the_local_server_starts_as_engine_serve_would_with_the_settings_seed_and_the_templates_options",),
    ),
    Mutation(
        "a path cut at its end holds what was above it with a slack (a failed reply's message pushed up)",
        (("app/qt/conversation/chat_view.py", "        cut = d == len(new) < len(old)  #", "        cut = False  #"),),
        ("tests/gui/test_documents.py::test_a_message_saved_unanswerable_by_an_older_version_can_be_repaired",),
    ),
    # issue 50, item 5: a stopped run's report states what it did (tests/engine/test_run_progress.py)
    Mutation(
        "a run stopped mid-prefill reports no tokens forwarded",
        (("engine/generate/loop.py", "        return Prefilled(forwarded, True, done - restored, time.perf_counter())\n",
          "        return Prefilled(forwarded, True, 0, time.perf_counter())\n"),),
        (RP + "test_a_run_stopped_mid_prefill_reports_the_tokens_it_forwarded_and_its_seed",),
    ),
    Mutation(
        "a run stopped after its prefill lists the last prompt token's forward",
        (("engine/generate/loop.py", "    if is_cancelled():  # the last prompt token is never forwarded: nothing will be decoded\n",
          "    forwarded.append([n_prompt - 1, n_prompt])\n"
          "    if is_cancelled():  # the last prompt token is never forwarded: nothing will be decoded\n"),),
        (RP + "test_a_run_stopped_after_its_prefill_never_forwarded_the_last_prompt_token",),
    ),
    Mutation(
        "the tokenizer's length warning logged where the engine only counts",
        (("engine/generate/templating.py",
          'logging.getLogger("transformers.tokenization_utils_base").addFilter(_OnlyCounting())\n', ""),),
        ("tests/engine/test_token_counting.py::test_counting_a_conversation_longer_than_the_tokenizers_maximum_logs_no_warning",),
    ),
    # issue 50, item 7: memory visible and bounded (tests/cache/test_memory_budget.py)
    Mutation(
        "a smaller memory budget evicts nothing until the next store",
        (("engine/cache/memory_tier.py", "            self.budget_bytes = budget_bytes\n            self._evict()\n",
          "            self.budget_bytes = budget_bytes\n"),),
        (MM + "test_a_smaller_budget_evicts_at_once_and_a_larger_one_keeps_more",),
    ),
    Mutation(
        "the memory tier keeps what its budget has no room for",
        (("engine/cache/memory_tier.py", "            self._insert(entry, blocks)\n            self._evict()\n",
          "            self._insert(entry, blocks)\n"),),
        (MM + "test_once_the_tier_is_full_the_engines_memory_stops_growing",),
    ),
    Mutation(
        "MLX's buffer cache left unbounded",
        (("engine/memory.py", "    return int(mx.set_cache_limit(limit))\n", "    return int(mx.set_cache_limit(1 << 40))\n"),),
        (MM + "test_once_the_tier_is_full_the_engines_memory_stops_growing",),
    ),
    # issue 50, item 5, the window: the run in progress (tests/app/test_live_run.py, the debug panel)
    Mutation(
        "the run in progress ignores the prefill's progress",
        (("app/core/generation/live_run.py", "                run = replace(run, done=event.done, total=event.total)\n",
          "                run = replace(run, total=event.total)\n"),),
        (LR + "test_a_live_run_folds_the_restore_the_progress_and_decode",
         LR + "test_the_run_in_progress_is_the_restore_then_the_prefill_then_the_final_report"),
    ),
    Mutation(
        "the run in progress is not told as it advances",
        (("app/core/generation/model.py", "            self.live = live\n            self.live_changed.emit(live)\n",
          "            self.live = live\n"),),
        (LR + "test_the_run_in_progress_is_the_restore_then_the_prefill_then_the_final_report",
         "tests/gui/test_reply_report.py::test_the_debug_panel_shows_the_run_in_progress_then_its_final_report"),
    ),
    Mutation(
        "the debug panel shows a reply being made as one with no report",
        (("app/qt/inspector/debug_panel.py", "        if live is not None and run is None:\n",
          "        if live is not None and run is None and False:\n"),),
        ("tests/gui/test_reply_report.py::test_the_debug_panel_shows_the_run_in_progress_then_its_final_report",),
    ),
    # issue 50, item 7, the window: the memory tier's budget set in Settings, the memory split shown
    Mutation(
        "the memory budget set in the window waits for the next load",
        (("app/core/engine_link/model.py", "        self.memory_budget = budget\n        self.jobs.spawn(self._apply_memory_budget(budget))\n",
          "        self.memory_budget = budget\n"),),
        ("tests/app/test_memory_link.py::test_the_memory_is_read_after_every_run_and_a_budget_applies_at_once_and_after_a_load",
         "tests/gui/test_models_and_settings.py::"
         "test_settings_show_the_memory_and_change_the_prompt_caches_budget_at_once_and_at_the_next_start"),
    ),
    Mutation(
        "the memory budget kept in settings.ini is not applied at start",
        (("app/qt/window/window.py", "        self.settings.restore_memory_budget()  # before the load: the engine's tier starts with it\n",
          ""),),
        ("tests/gui/test_models_and_settings.py::"
         "test_settings_show_the_memory_and_change_the_prompt_caches_budget_at_once_and_at_the_next_start",),
    ),
    Mutation(
        "the process's memory split is never read",
        (("app/core/engine_link/model.py", "        self._show_stats(stats, memory)\n        self._show_memory(report)\n",
          "        self._show_stats(stats, memory)\n"),),
        ("tests/app/test_memory_link.py::test_the_memory_is_read_after_every_run_and_a_budget_applies_at_once_and_after_a_load",
         "tests/gui/test_models_and_settings.py::"
         "test_settings_show_the_memory_and_change_the_prompt_caches_budget_at_once_and_at_the_next_start"),
    ),
    # issue 50, item 9: promises no test checked (tests/engine/test_planted_promises.py)
    Mutation(
        "a logprob rounded as it is reported",
        (("engine/generate/sampling.py",
          "        return token, mx.take_along_axis(logprobs, token[:, None], axis=-1)[0, 0], logprobs\n",
          "        return token, mx.take_along_axis(logprobs, token[:, None], axis=-1)[0, 0].astype(mx.float16)"
          ".astype(mx.float32), logprobs\n"),),
        (PP + "test_a_reported_logprob_is_the_log_softmax_of_its_steps_logits",),
    ),
    Mutation(
        "logprobs of the tempered distribution",
        (("engine/generate/sampling.py",
          "        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)\n",
          "        logits = logits / (self.s.temperature or 1.0)\n"
          "        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)\n"),),
        (PP + "test_a_reported_logprob_is_the_log_softmax_of_its_steps_logits",),
    ),
    Mutation(
        "only the first document's end is a cut",
        (("engine/generate/prepare.py", "{s.end for s in spans if s.cut}", "{s.end for s in spans[:1] if s.cut}"),),
        (PP + "test_the_second_of_two_documents_gets_its_own_cut_and_snapshot",),
    ),
    Mutation(
        "a document snapshot only at the first document's end",
        (("engine/generate/prepare.py", "for i, s in enumerate(spans) if s.cut}",
          "for i, s in enumerate(spans[:1]) if s.cut}"),),
        (PP + "test_the_second_of_two_documents_gets_its_own_cut_and_snapshot",),
    ),
    Mutation(
        "a snapshot of two documents kept only while both are in use",
        (("engine/cache/eviction.py", "        needed = meta.documents[:1] if meta.trimmable else meta.documents\n",
          "        needed = meta.documents\n"),),
        (PP + "test_which_documents_keep_a_document_snapshot_ahead",
         PP + "test_a_snapshot_of_two_documents_with_one_still_in_use"),
    ),
    Mutation(
        "a snapshot of two documents kept while any of them is in use",
        (("engine/cache/eviction.py", KEPT_WHILE_USED,
          "        return 1 if used is None or any(d in used for d in meta.documents) else 0\n"),),
        (PP + "test_which_documents_keep_a_document_snapshot_ahead",
         PP + "test_a_snapshot_of_two_documents_with_one_still_in_use"),
    ),
]


def target_problems(mutations: list[Mutation], root: Path = ROOT) -> list[str]:
    """Why a mutation could not be applied to `root` as written (empty: all fine)."""
    out = []
    for m in mutations:
        for rel, old, _ in m.edits:
            n = (root / rel).read_text().count(old)
            if n != 1:
                out.append(f"{m.name}: target found {n} times in {rel}: {old.strip()[:80]!r}")
        for node in m.tests:
            rel, _, name = node.partition("::")
            if f"def {name.split('[')[0]}(" not in (root / rel).read_text():
                out.append(f"{m.name}: no test {node}")
    return out


def apply(tree: Path, m: Mutation) -> None:
    for rel, old, new in m.edits:
        path = tree / rel
        text = path.read_text()
        n = text.count(old)
        if n != 1:
            raise SystemExit(f"mutation {m.name!r}: target text found {n} times in {rel} (expected once); "
                             f"the code moved, update tests/mutation_check.py:\n{old}")
        path.write_text(text.replace(old, new))


def copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


# A <failure> counts as the test's own verdict when pytest reports an assertion: `assert ...`
# (rewritten), an AssertionError (assert with a message, pytest.raises(match=)), or pytest.fail /
# "DID NOT RAISE" ("Failed: ..."). Anything else is the mutated code (or the test) crashing.
ASSERTION_MESSAGES = ("assert ", "AssertionError", "Failed: ")


@dataclass
class Run:
    """One pytest run of a tree's catchers, read from its junit XML."""

    asserted: list[str]  # failed on an assertion
    crashed: list[str]  # failed on another exception, or errored (setup, teardown, collection)
    skipped: list[str]
    ran: list[str]  # every test case reported
    rc: int  # pytest's exit code; -1: killed at the timeout
    tail: str = ""  # pytest's last output, when something went wrong

    @property
    def timed_out(self) -> bool:
        return self.rc == -1

    def verdict(self) -> str:
        if self.asserted:
            return "caught"
        if self.timed_out:
            return "TIMEOUT"
        return "ERROR" if self.crashed or self.rc not in (0, 1) else "SURVIVED"


def node_of(case: ET.Element) -> str:
    module = case.get("classname", "").replace(".", "/") + ".py"
    return f"{module}::{case.get('name')}"


def run_tests(tree: Path, tests: tuple[str, ...], tag: str, timeout: float) -> Run:
    """Run `tests` in `tree` (killed, with its children, after `timeout` seconds)."""
    xml = tree / f".mutation-{tag}.xml"
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                             *tests], cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = -1
    run = Run([], [], [], [], rc, out[-4000:] if rc not in (0, 1) else "")
    if rc == -1 or not xml.exists():
        return run
    for case in ET.parse(xml).getroot().iter("testcase"):
        node = node_of(case)
        run.ran.append(node)
        failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
        if failure is not None and (failure.get("message") or "").startswith(ASSERTION_MESSAGES):
            run.asserted.append(node)
        elif failure is not None or error is not None:
            run.crashed.append(node)
        elif skipped is not None:
            run.skipped.append(node)
    return run


def check_imports(tree: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", "import engine, engine.engine, engine.cache.disk.tier; "
                          "print(engine.__file__)"], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the tree in {tree} does not import:\n{out.stderr[-3000:]}")
    if not out.stdout.strip().startswith(str(tree)):
        raise SystemExit(f"`import engine` resolves to {out.stdout.strip()}, not the copy in {tree}")


def baseline_problems(run: Run, catchers: tuple[str, ...]) -> list[str]:
    """Why the unmutated tree's catcher run proves nothing (empty: every catcher ran and passed)."""
    out = [f"failed: {n}" for n in run.asserted + run.crashed] + [f"skipped: {n}" for n in run.skipped]
    if run.timed_out:
        out.append("the run timed out")
    elif run.rc != 0:
        out.append(f"pytest exited with {run.rc}")
    for node in catchers:  # a catcher that never ran (a typo, a deselected parameter) checks nothing
        if not any(r == node or r.startswith(node + "[") for r in run.ran):
            out.append(f"did not run: {node}")
    return out


def short(node: str) -> str:
    return node.split("/")[-1].replace(".py::", "::")


def by_tests(nodes: list[str]) -> str:
    return ", ".join(sorted({short(f).split("[")[0] + ("[...]" if "[" in f else "") for f in nodes})) or "-"


def revision() -> str:
    """The checkout's commit, marked when the working tree has changes the commit does not hold."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return (head.stdout.strip() or "unknown") + ("+changes" if dirty else "")


TABLE_HEAD = "| mutation | caught | by | last run |"


def table_row(m: Mutation, run: Run, when: str) -> str:
    outcome = {"caught": "yes"}.get(run.verdict(), "NO: " + run.verdict().lower())
    by = by_tests(run.asserted) if run.asserted else "-"
    return f"| {m.name} | {outcome} | {by} | {when} |"


def record(rows: dict[str, str], docs: Path = DOCS) -> None:
    """Put `rows` (mutation name -> table row) into the mutation table of `docs`: a row per
    mutation, replaced when it exists, appended otherwise; rows of mutations no longer in the
    list are dropped."""
    lines = docs.read_text().splitlines()
    try:
        head = lines.index(TABLE_HEAD)
    except ValueError:
        raise SystemExit(f"no mutation table in {docs} (a line {TABLE_HEAD!r})") from None
    end = head + 2
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    old = {re.split(r" \| ", line[2:], maxsplit=1)[0]: line for line in lines[head + 2 : end]}
    lines[head + 2 : end] = [rows.get(m.name) or old.get(m.name) or f"| {m.name} | not run yet | - | - |"
                             for m in MUTATIONS]
    docs.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", action="append", help="only mutations whose name contains this (repeatable: any of them)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary trees")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per mutant's test run")
    ap.add_argument("--record", action="store_true", help="write the results into the table in docs/testing.md")
    args = ap.parse_args()
    chosen = [m for m in MUTATIONS if not args.k or any(k in m.name for k in args.k)]
    if not chosen:
        raise SystemExit("no mutation matches")
    t_start = time.monotonic()
    when = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} {revision()}"
    base = Path(tempfile.mkdtemp(prefix="verbatim-mutants-"))
    rows: list[tuple[Mutation, Run, float]] = []
    try:
        problems = target_problems(chosen)  # every target exists before anything runs
        if problems:
            raise SystemExit("the code moved, update tests/mutation_check.py:\n" + "\n".join(problems))
        clean = base / "clean"
        copy_tree(clean)
        check_imports(clean)
        baseline = tuple(sorted({t for m in chosen for t in m.tests}))
        run = run_tests(clean, baseline, "baseline", args.timeout * len(chosen))
        refused = baseline_problems(run, baseline)
        if refused:
            print("The unmutated tree does not pass all its catchers; fix that first:", *refused, sep="\n  ")
            if run.tail:
                print(run.tail)
            return 2
        print(f"baseline: {len(baseline)} catchers ({len(run.ran)} test cases) pass on the unmutated tree, none skipped")
        for i, m in enumerate(chosen):
            tree = base / f"m{i}"
            copy_tree(tree)
            apply(tree, m)
            check_imports(tree)
            t0 = time.monotonic()
            run = run_tests(tree, m.tests, f"m{i}", args.timeout)
            rows.append((m, run, time.monotonic() - t0))
            print(f"[{run.verdict()}] {m.name} ({time.monotonic() - t0:.0f} s)", flush=True)
            if run.verdict() != "caught":
                for node in run.crashed:
                    print(f"    crashed (not an assertion): {short(node)}")
                if run.tail:
                    print("    " + run.tail[-1500:].replace("\n", "\n    "))
            if not args.keep:
                shutil.rmtree(tree, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(TABLE_HEAD)
    print("|---|---|---|---|")
    for m, run, _ in rows:
        print(table_row(m, run, when))
    if args.record:
        record({m.name: table_row(m, run, when) for m, run, _ in rows})
        print(f"\nrecorded in {DOCS}")
    missed = [m.name for m, run, _ in rows if run.verdict() != "caught"]
    print(f"\n{len(rows) - len(missed)}/{len(rows)} mutations caught in {time.monotonic() - t_start:.0f} s")
    if missed:
        print("NOT CAUGHT:", *missed, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
