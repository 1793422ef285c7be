"""Disable each privacy-critical rule in turn and show that the tests go red.

Each mutation edits one line of a copy of the source (the checked text must be
found, so a renamed rule fails here loudly rather than passing silently), runs
the tests that guard the rule against the copy, and expects them to fail. Run
it directly (``python tests/mutation_check.py [NAME ...]``); tests/test_mutations.py
runs it in the suite.

``--record`` runs each mutation against all of its guarding tests and writes the first test
that kills it to tests/mutation_killers.json; later runs try that test alone first (see
``KILLERS``):

    python tests/mutation_check.py [--record] [NAME ...]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # in the source tree
    before: str
    after: str
    tests: tuple[str, ...]


MUTATIONS = [
    Mutation(
        "costs round down",
        "accountant/exact.py",
        "return min(math.ceil(exact * self.scale), SATURATION)",
        "return min(math.floor(exact * self.scale), SATURATION)",
        ("tests/test_exact.py",),
    ),
    Mutation(
        "limits round up",
        "accountant/exact.py",
        "return min(math.floor(exact * self.scale), SATURATION)",
        "return min(math.ceil(exact * self.scale), SATURATION)",
        ("tests/test_exact.py",),
    ),
    Mutation(
        "joint record scaling dropped",
        "accountant/accounting/pricing.py",
        "return max_records * (n if k is None else min(k, n))",
        "return max_records",
        ("tests/test_pricing.py",),
    ),
    Mutation(
        "parallel record scaling dropped",
        "accountant/accounting/pricing.py",
        '    if release == "parallel":\n        return max_records\n',
        '    if release == "parallel":\n        return 1\n',
        ("tests/test_pricing.py",),
    ),
    Mutation(
        "max over partitions dropped",
        "accountant/accounting/loss.py",
        "values[name] = max(state.max_all[name], state.max_touched[name] + c)",
        "values[name] = state.max_touched[name] + c",
        ("tests/test_loss_rules.py",),
    ),
    Mutation(
        "top-k reduced to the largest",
        "accountant/accounting/loss.py",
        "return sum(sorted([*self.outside, *(v + c for v in self.inside)], reverse=True)[:k])",
        "return sum(sorted([*self.outside, *(v + c for v in self.inside)], reverse=True)[:1])",
        ("tests/test_loss_rules.py",),
    ),
    Mutation(
        "the joint and parallel parts' bounds combined by their max",
        "accountant/accounting/loss.py",
        'values[name] = min(bounds["every"], bounds["joint"] + bounds["parallel"])',
        'values[name] = min(bounds["every"], max(bounds["joint"], bounds["parallel"]))',
        ("tests/test_scope_rules.py::test_the_user_loss_is_never_below_the_worst_person",),
    ),
    Mutation(
        "a joint release left out of the joint part",
        "accountant/accounting/loss.py",
        'return part in ("every", "joint" if release == "joint" else "parallel")',
        'return part in ("every", "parallel" if release == "parallel" else "every")',
        ("tests/test_scope_rules.py::test_the_user_loss_is_never_below_the_worst_person",),
    ),
    Mutation(
        "a charge adds to s(p) but not to s_J(p) or s_P(p)",
        "accountant/services/charge_plan.py",
        "part: decision.priced.cost if holds(part, release) else Amount() for part in kept",
        'part: decision.priced.cost if part == "every" else Amount() for part in kept',
        ("tests/test_loss_rules.py",),
    ),
    Mutation(
        "the top-k rule's joint and parallel parts not kept",
        "accountant/accounting/loss.py",
        'return PARTS if self.uses_top_k else ("every",)',
        'return ("every",)',
        ("tests/test_loss_rules.py",),
    ),
    Mutation(
        "spend from before the split counted in neither part",
        "migrations/versions/0014_joint_parallel_parts.py",
        'op.execute(f"UPDATE tally_spends SET {spends} WHERE tally_id IN ({top_k})")',
        "pass",
        ("tests/test_storage.py::test_the_joint_and_parallel_parts_are_filled_from_the_ledger",),
    ),
    Mutation(
        "parallel multiplicity dropped",
        "accountant/accounting/loss.py",
        "            return min(k, partition_count)\n        return partition_count",
        "            return 1\n        return partition_count",
        ("tests/test_loss_rules.py",),
    ),
    Mutation(
        "a charge too large for any top-k window is told to wait",
        "accountant/accounting/checks.py",
        "alone = loss_after(rule, fresh(rule, partition_count), cost, m, release, names)",
        "alone = loss_after(rule, ScopeState(), cost, m, release, names)",
        (
            "tests/test_denials.py::"
            "test_cost_alone_above_a_window_limit_is_409_on_a_user_dataset_with_bounded_k",
        ),
    ),
    Mutation(
        "grid rounding paid once per release",
        "plugins/_samplers.py",
        "return math.ceil(Fraction(sensitivity) / Fraction(grid)) + coordinates",
        "return math.ceil(Fraction(sensitivity) / Fraction(grid)) + 1",
        ("tests/test_mechanisms.py",),
    ),
    Mutation(
        "inputs snapped through a double",
        "plugins/_samplers.py",
        "numerator, denominator = value.as_integer_ratio()",
        "numerator, denominator = float(value).as_integer_ratio()",
        ("tests/test_large_inputs.py",),
    ),
    Mutation(
        "a charge that fails after its writes fails every charge that shared its transaction",
        "accountant/group_commit.py",
        '    return "alone" if shared and isinstance(error, Exception) else None\n',
        "    return None\n",
        ("tests/test_group_commit.py",),
    ),
    Mutation(
        "a duplicate key fails every charge that shared its transaction",
        "accountant/group_commit.py",
        '            return "alone" if shared else "queued"\n',
        "            return None\n",
        ("tests/test_group_commit.py",),
    ),
    Mutation(
        "a refusal ends the transaction it shared, and every charge in it runs again",
        "accountant/group_commit.py",
        "            if tx.applied or isinstance(error, DBAPIError):",
        "            if True:",
        (
            "tests/test_group_commit.py::"
            "test_charges_refused_before_their_writes_leave_the_others_to_commit_once",
        ),
    ),
    Mutation(
        "a charge trusts the key read before its lock",
        "accountant/services/charge_reads.py",
        "    if not dataset.key_valid:",
        "    if False:",
        ("tests/test_known_keys.py",),
    ),
    Mutation(
        "a remembered key is not read again when its request fails",
        "accountant/api/auth.py",
        "            known.remember(key_hash, _authenticated(key_hash))",
        "            pass",
        ("tests/test_known_keys.py",),
    ),
    Mutation(
        "a charge reads grants from its authenticated principal",
        "accountant/accounting/decide.py",
        "    elif not may_charge(dataset.role, dataset.granted):",
        "    elif not may_charge(dataset.role, dataset.id in request.principal.granted):",
        ("tests/test_known_keys.py::test_grants_are_read_with_the_charge_not_remembered",),
    ),
    Mutation(
        "a charge reads the role from its authenticated principal",
        "accountant/accounting/decide.py",
        "    elif not may_charge(dataset.role, dataset.granted):",
        "    elif not may_charge(request.principal.role, dataset.granted):",
        ("tests/test_known_keys.py::test_a_role_is_read_with_the_charge_not_remembered",),
    ),
    Mutation(
        "the grant check dropped",
        "accountant/accounting/decide.py",
        "    elif not may_charge(dataset.role, dataset.granted):",
        "    elif False:",
        ("tests/test_known_keys.py::test_grants_are_read_with_the_charge_not_remembered",),
    ),
    Mutation(
        "a service may charge a dataset not granted to it",
        "accountant/accounting/decide.py",
        'return role == "admin" or (role == "service" and granted)',
        'return role in ("admin", "service")',
        ("tests/test_access.py",),
    ),
    Mutation(
        "replay ignores the implementation",
        "accountant/services/idempotency.py",
        "elif first.implementation != mechanism.implementation:",
        "elif False:",
        ("tests/test_replay.py",),
    ),
    Mutation(
        "a long lock wait keeps the windows read before it",
        "accountant/services/charge_reads.py",
        "if any(w.start > Window.containing(w.period, sent.at).end for w in windows):",
        "if False:",
        ("tests/test_clock.py",),
    ),
    Mutation(
        "the top-k read of a new partition is not padded with its zero",
        "accountant/accounting/decide.py",
        "padded = inside[:k] + [0] * (min(k, n) - len(inside[:k]))",
        "padded = inside[:k]",
        ("tests/test_loss_rules.py::test_user_unit_counts_each_partition_a_charge_touches_first",),
    ),
    Mutation(
        "scopes deny in reverse contract order",
        "accountant/accounting/checks.py",
        "        rank = SCOPE_ORDER.index(denial.scope)",
        "        rank = -SCOPE_ORDER.index(denial.scope)",
        ("tests/test_denials.py::test_window_and_lifetime_together_is_409_naming_the_dataset",),
    ),
    Mutation(
        "the consumer's quota is not checked",
        "accountant/accounting/decide.py",
        "        if dataset.quota is not None and dataset.granted:",
        "        if False:",
        ("tests/test_denials.py::test_consumer_quota_is_409",),
    ),
    Mutation(
        "the window budgets are not checked",
        "accountant/accounting/decide.py",
        "for budget, window in zip(dataset.windows, self.windows, strict=True):",
        "for budget, window in []:",
        ("tests/test_denials.py::test_window_scope_is_429_with_retry_after",),
    ),
    Mutation(
        "the per-partition limit is not checked",
        "accountant/accounting/decide.py",
        "        if dataset.partition_limit is not None:",
        "        if False:",
        ("tests/test_denials.py::test_partition_scope_names_the_partition",),
    ),
    Mutation(
        "a window a charge can never fit is not named before one that resets later",
        "accountant/accounting/checks.py",
        "        waiting_fails = hopeless is not None and hopeless(denial)",
        "        waiting_fails = False",
        (
            "tests/test_denials.py::"
            "test_a_window_the_charge_can_never_fit_is_named_before_one_that_resets_later",
        ),
    ),
    Mutation(
        "a limit stated as rho where rho is not enforced is dropped, binding nothing",
        "accountant/accounting/modes.py",
        '    if rho is not None and (mode.name != "zcdp" or mode.composition_delta is not None):',
        '    if False and rho is not None and (mode.name != "zcdp"):',
        ("tests/test_bad_input.py::test_bad_dataset_is_400",),
    ),
    Mutation(
        "a charge too large for any window is told to wait",
        "accountant/accounting/decide.py",
        "    never = denial is not None and hopeless(denial)",
        "    never = False and hopeless(denial)",
        ("tests/test_denials.py::test_cost_alone_above_a_window_limit_is_409",),
    ),
    Mutation(
        "the ledger chain leaves out the previous hash",
        "accountant/services/ledger.py",
        "return hashlib.sha256(prev_hash.encode() + content).hexdigest()",
        "return hashlib.sha256(content).hexdigest()",
        ("tests/test_ledger_export.py::test_an_untouched_export_verifies_with_both_verifiers",),
    ),
    Mutation(
        "a block may read a table another of its statements writes",
        "accountant/statements.py",
        "if writer.get(table, index) != index and table not in allowed:",
        "if False:",
        ("tests/test_driver.py::test_statements_run_together_each_take_effect",),
    ),
    Mutation(
        "a block may write one table twice",
        "accountant/statements.py",
        "                if table in writer:\n",
        "                if False:\n",
        ("tests/test_driver.py::test_statements_run_together_each_take_effect",),
    ),
    Mutation(
        "randomized response composes as rho * f^2",
        "accountant/accounting/pricing.py",
        "None if rho is None else rho * factor,",
        "None if rho is None else rho * factor * factor,",
        ("tests/test_pricing.py",),
    ),
    Mutation(
        "randomized response keeps the truth with weight 1 when e^epsilon < k - 1",
        "plugins/randomized_response.py",
        "units = _exp_below(exponent, bits) // ((k - 1) << _GUARD_BITS)",
        "units = 2**_WEIGHT_BITS",
        ("tests/test_mechanisms.py::test_randomized_response_loses_exactly_its_charge",),
    ),
    Mutation(
        "randomized response's exact coin at a larger epsilon",
        "plugins/randomized_response.py",
        "        exponent = epsilon\n",
        "        exponent = epsilon * (1 + Fraction(1, 10**6))\n",
        ("tests/test_mechanisms.py::test_randomized_response_loses_exactly_its_charge",),
    ),
    Mutation(
        "rdp charges rho without the order",
        "accountant/accounting/modes.py",
        "return RHO.cost_units(cost.rho * Fraction(order))",
        "return RHO.cost_units(cost.rho)",
        ("tests/test_rdp_gdp.py::test_gaussians_fit_until_b_of_the_order",),
    ),
    Mutation(
        "rdp charges epsilon-DP releases epsilon^2/2",
        "accountant/accounting/modes.py",
        "return RHO.cost_units(renyi_of_pure(cost.epsilon, order))",
        "return RHO.cost_units(cost.epsilon**2 / 2)",
        ("tests/test_rdp_gdp.py::test_laplace_is_charged_the_epsilon_dp_bound",),
    ),
    Mutation(
        "the advanced filter drops its sum of epsilon^2 / 2",
        "accountant/accounting/advanced.py",
        "rho = ((log_term + epsilon).sqrt() - log_term.sqrt()) ** 2",
        "rho = epsilon**2 / (4 * log_term)",
        (
            "tests/test_advanced_composition.py::test_the_filter_never_admits_what_the_theorem_refuses",
        ),
    ),
    Mutation(
        "the advanced filter lets the releases spend delta'",
        "accountant/accounting/advanced.py",
        "delta_limit = DELTA.limit_units(delta) - composition_delta",
        "delta_limit = DELTA.limit_units(delta)",
        (
            "tests/test_advanced_composition.py::test_the_filter_never_admits_what_the_theorem_refuses",
        ),
    ),
    Mutation(
        "the advanced filter charges epsilon^2 / 4",
        "accountant/accounting/modes.py",
        "rho=RHO.cost_units(cost.epsilon**2 / 2) if self.advanced else 0,",
        "rho=RHO.cost_units(cost.epsilon**2 / 4) if self.advanced else 0,",
        (
            "tests/test_advanced_composition.py::test_the_filter_never_admits_what_the_theorem_refuses",
        ),
    ),
    Mutation(
        "verify skips the chain heads' seals",
        "accountant/services/verification.py",
        "found = Problem(*sealed) if sealed else head_problem(session, hasher)",
        "found = Problem(*sealed) if sealed else None",
        ("tests/test_head_seals.py",),
    ),
    Mutation(
        "an append seals a new head over one the service did not seal",
        "accountant/seals.py",
        "if not hmac.compare_digest(seal, of_head(hasher, name, seq, head)):",
        "if False:",
        ("tests/test_head_seals.py",),
    ),
    Mutation(
        "verify trusts the recorded loss_after",
        "accountant/services/verification.py",
        "        if recorded != expected:",
        "        if False:",
        ("tests/test_head_seals.py",),
    ),
    Mutation(
        "gdp charges the grid sampler mu = D/sigma",
        "plugins/gaussian.py",
        "GDP_MARGIN = 1 + Fraction(1, 2**20)",
        "GDP_MARGIN = 1 + Fraction(0)",
        ("tests/test_rdp_gdp.py::test_the_charged_mu_dominates_the_grid_sampler",),
    ),
    Mutation(
        "gdp charges a coordinate that moves by one grid unit mu = 1/s",
        "plugins/gaussian.py",
        "GDP_MARGIN = 1 + Fraction(1, 2**20)",
        "GDP_MARGIN = 1 + Fraction(0)",
        ("tests/test_rdp_gdp.py::test_a_coordinate_moved_by_one_grid_unit_stays_within_its_share",),
    ),
    Mutation(
        "a batch prices the grid Gaussian as a continuous one (no margin)",
        "plugins/gaussian.py",
        "    shift = _double_at_least(GDP_MARGIN)\n",
        "    shift = 1.0\n",
        ("tests/test_plan_pricing.py::test_the_gaussian_privacy_loss_carries_the_margin",),
    ),
    Mutation(
        "a batch prices discrete_laplace one unit of sensitivity short",
        "plugins/discrete_laplace.py",
        "    shift = math.floor(sensitivity)\n",
        "    shift = math.floor(sensitivity) - 1\n",
        ("tests/test_plan_pricing.py::test_the_discrete_laplace_pair_is_dp_accountings",),
    ),
    Mutation(
        "a batch checks each scope before its item instead of after",
        "accountant/services/batches.py",
        "            if limit.is_exceeded_by(check.after, names) and scope not in run.denials:\n",
        "            if limit.is_exceeded_by(check.spent, names) and scope not in run.denials:\n",
        (
            "tests/test_batches.py::test_items_add_up_and_a_refused_batch_charges_and_releases_nothing",
        ),
    ),
    Mutation(
        "a refused batch keeps its items' writes",
        "accountant/services/batches.py",
        '        driver.run("ROLLBACK TO SAVEPOINT batch_items")\n',
        '        driver.run("RELEASE SAVEPOINT batch_items")\n',
        (
            "tests/test_batches.py::test_items_add_up_and_a_refused_batch_charges_and_releases_nothing",
        ),
    ),
    Mutation(
        "a weighted plan fits all that remains instead of its share",
        "accountant/accounting/checks.py",
        "            else before[name] + math.floor(share * max(0, bound - before[name]))\n",
        "            else bound\n",
        (
            "tests/test_batches.py::"
            "test_a_weighted_plan_splits_what_remains_and_its_answer_is_granted_as_a_batch",
        ),
    ),
    Mutation(
        "a group's cost is split rounded down",
        "accountant/accounting/plan_pricing.py",
        "    part = Amount(-(-total.epsilon // n), -(-total.delta // n), -(-total.rho // n))\n",
        "    part = Amount(total.epsilon // n, total.delta // n, total.rho // n)\n",
        ("tests/test_plan_pricing.py",),
    ),
    Mutation(
        "a sub-budget that converts to a zero limit is stored",
        "accountant/accounting/admits.py",
        "    if limit.rho != 0:\n",
        "    if True:\n",
        (
            "tests/test_zero_limits.py::test_a_budget_that_admits_nothing_is_refused_with_the_least_that_admits",
        ),
    ),
    Mutation(
        "the least epsilon named one unit too low",
        "accountant/accounting/admits.py",
        "return EPSILON.to_decimal(least_units(within, guess))",
        "return EPSILON.to_decimal(least_units(within, guess) - 1)",
        (
            "tests/test_zero_limits.py::test_a_budget_that_admits_nothing_is_refused_with_the_least_that_admits",
        ),
    ),
    Mutation(
        "a hold charges none of its scopes",
        "accountant/services/charge_plan.py",
        "        opening, scopes = _scope_writes(decision)\n",
        "        opening, scopes = _scope_writes(decision) if hold is None else ([], [])\n",
        ("tests/test_holds.py::test_a_hold_is_charged_at_once_and_shown_apart_as_held",),
    ),
    Mutation(
        "a hold may outlast the shortest window",
        "accountant/accounting/decide.py",
        "        if expires_at > end_us:",
        "        if False:",
        (
            "tests/test_holds.py::test_a_hold_over_a_window_is_429_and_may_not_outlast_the_shortest_window",
        ),
    ),
    Mutation(
        "an accounting-only mechanism takes a record-level sensitivity",
        "accountant/accounting/pricing.py",
        "    if sensitivity_unit is not None and not mechanism.runs:",
        "    if False:",
        (
            "tests/test_holds.py::test_an_accounting_only_mechanism_takes_no_record_level_sensitivity",
        ),
    ),
    Mutation(
        "the ledger's replay leaves holds out",
        "accountant/services/ledger.py",
        '    return kind == "hold" or (kind == "charge" and hold_id is None)',
        '    return kind == "charge" and hold_id is None',
        ("tests/test_holds.py::test_a_hold_is_charged_at_once_and_shown_apart_as_held",),
    ),
    Mutation(
        "the sampled Gaussian's Renyi interval gives its lower end",
        "plugins/_sampled_gaussian.py",
        "PRECISION_BITS)[1]",
        "PRECISION_BITS)[0]",
        ("tests/test_sampled_gaussian.py",),
    ),
    Mutation(
        "a fractional Renyi order is priced at the integer order below",
        "plugins/_sampled_gaussian.py",
        "    alpha = math.ceil(order)\n",
        "    alpha = max(2, math.floor(order))\n",
        ("tests/test_sampled_gaussian.py",),
    ),
    Mutation(
        "the sampling rate is rounded to the nearest double",
        "plugins/_sampled_gaussian.py",
        "    if Fraction(result) < value:\n        result = math.nextafter(result, math.inf)\n",
        "",
        ("tests/test_sampled_gaussian.py",),
    ),
    Mutation(
        "a draw charges the scopes again",
        "accountant/services/charge_plan.py",
        "        if decision.drawn_from is not None:\n",
        "        if False:\n",
        (
            "tests/test_holds.py::test_a_draw_runs_its_mechanism_and_takes_its_cost_from_the_hold_alone",
        ),
    ),
    Mutation(
        "a draw may exceed its hold's remainder",
        "accountant/accounting/holds.py",
        '    if state == "open" and not any(after[name] > hold.amount[name] for name in names):',
        '    if state == "open":',
        ("tests/test_holds.py::test_a_draw_over_the_remainder_is_409_naming_the_hold",),
    ),
    Mutation(
        "an expired hold may be drawn on",
        "accountant/accounting/holds.py",
        '        if self.state == "open" and now_us >= self.expires_at:',
        "        if False:",
        ("tests/test_holds.py::test_an_expired_hold_cannot_be_drawn_on",),
    ),
    Mutation(
        "a settle may go below what its charges drew",
        "accountant/accounting/holds.py",
        "        if used[name] < hold.drawn[name]:",
        "        if False:",
        ("tests/test_holds.py::test_a_settle_outside_drawn_and_amount_is_400_and_changes_nothing",),
    ),
    Mutation(
        "a plan composed tightly on approx settles at fewer steps",
        "accountant/accounting/holds.py",
        "    if whole_only and used not in (hold.amount, hold.drawn):",
        "    if False:",
        (
            "tests/test_holds.py::test_a_plan_composed_tightly_on_approx_settles_whole_or_is_released",
        ),
    ),
    Mutation(
        "a settle leaves the scopes' largest s(p) as it was",
        "accountant/services/settles.py",
        '        values[getattr(Tally, f"max_{name}")] = largest',
        "        pass",
        ("tests/test_holds.py::test_a_settle_returns_what_the_job_did_not_use_to_every_scope",),
    ),
    Mutation(
        "the ledger's verifier does not replay settles",
        "accountant/services/verification.py",
        "        elif gives_back(entry.kind, entry.status):",
        "        elif False:",
        ("tests/test_holds.py::test_a_settle_returns_what_the_job_did_not_use_to_every_scope",),
    ),
    Mutation(
        "population check removed",
        "accountant/accounting/decide.py",
        "        if population is not None:\n            checks.append(",
        "        if False:\n            checks.append(",
        ("tests/test_populations.py",),
    ),
    Mutation(
        "population loss not moved by a grant",
        "accountant/services/charge_plan.py",
        "            main += population_loss(decision.dataset, decision.population_after)\n",
        "",
        ("tests/test_populations.py",),
    ),
    Mutation(
        "population loss not lowered by a settle",
        "accountant/services/settles.py",
        "        *population_loss(dataset, _population_after(settlement, dataset)),\n",
        "",
        ("tests/test_populations.py",),
    ),
    Mutation(
        "a raised limit applies without approval",
        "accountant/api/datasets.py",
        "        raised = requests.on() and (",
        "        raised = False and (",
        ("tests/test_approvals.py",),
    ),
    Mutation(
        "a limit removed is no raise",
        "accountant/services/approvals.py",
        "    if new is None:\n        return True",
        "    if new is None:\n        return False",
        ("tests/test_approvals.py",),
    ),
    Mutation(
        "the requester approves their own request",
        "accountant/services/approvals.py",
        "    if request.requested_by == caller.consumer_id:",
        "    if False:",
        ("tests/test_approvals.py",),
    ),
    Mutation(
        "a request on a changed target is approved",
        "accountant/services/approvals.py",
        "        if now_digest != request.target_sha256:",
        "        if False:",
        ("tests/test_approvals.py",),
    ),
    Mutation(
        "a pending request never expires",
        "accountant/models/change_request.py",
        'if self.state == "pending" and self.expires_at <= now_us:',
        "if False:",
        ("tests/test_approvals.py",),
    ),
    Mutation(
        "a new admin needs no approval",
        "accountant/api/consumers.py",
        '    if body["role"] == "admin" and requests.on():',
        "    if False:",
        ("tests/test_approvals.py",),
    ),
    Mutation(
        "a folded read misses what its own set's last item added",
        "accountant/services/folded_reads.py",
        "max_touched=row.max_touched if grown is None else row.max_touched.plus(grown),",
        "max_touched=row.max_touched,",
        ("tests/test_folded_reads.py",),
    ),
    Mutation(
        "a folded read keeps a per-partition spend as it was",
        "accountant/services/folded_reads.py",
        "spends[partition] = spends.get(partition, Amount()).plus(grown)",
        "pass",
        ("tests/test_folded_reads.py",),
    ),
    Mutation(
        "a folded read misses a population charged through another member",
        "accountant/services/folded_reads.py",
        "            elif population is not None and _member(read, population.id):",
        "            elif False:",
        ("tests/test_folded_reads.py",),
    ),
    Mutation(
        "a folded read of an overlapping set is kept",
        "accountant/services/folded_reads.py",
        "    elif keys.isdisjoint(charged):",
        "    elif True:",
        ("tests/test_folded_reads.py",),
    ),
]

#: Where each source folder lives as an importable package in the copy.
_PACKAGES = {
    "accountant": "accountant",
    "plugins": "accountant_plugins",
    "migrations": "accountant_migrations",
    "tests": "tests",
}


def _copy(target: Path) -> None:
    for source, name in _PACKAGES.items():
        shutil.copytree(
            ROOT / source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")
    shutil.copytree(ROOT / "docs", target / "docs")  # the ledger's verifier is in its text


def _source_path(copy: Path, path: str) -> Path:
    folder, rest = path.split("/", 1)
    return copy / _PACKAGES[folder] / rest


#: The guarding test that failed first when each mutation was last run against all of its
#: guarding tests (``--record`` rewrites the file). A mutation runs that test alone first;
#: only if it passes does it run all of its guarding tests, as without it, so a stale entry
#: costs time, never a verdict.
KILLERS = Path(__file__).with_name("mutation_killers.json")


def run(
    mutation: Mutation, tests: tuple[str, ...], *, applied: bool = True
) -> tuple[int, float, list[str]]:
    """pytest's exit code for ``tests`` (files or test ids) with ``mutation`` applied (where
    they must fail: 1) or, with ``applied=False``, on the unchanged copy (where they must
    pass: 0), the seconds it took, and the ids of the tests that failed."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as folder:
        copy = Path(folder)
        _copy(copy)
        target = _source_path(copy, mutation.path)
        text = target.read_text()
        if text.count(mutation.before) != 1:
            raise SystemExit(
                f"{mutation.name}: the rule's text was not found once in "
                f"{mutation.path}; update tests/mutation_check.py"
            )
        if applied:
            target.write_text(text.replace(mutation.before, mutation.after))
        # SQLite only, and no metrics folder of some server this process once ran
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("ACCOUNTANT_TEST_POSTGRES_URL", "PROMETHEUS_MULTIPROC_DIR")
        }
        started = time.monotonic()
        log = copy / "pytest.log"
        # The copy is the working directory, so it is imported before the installed package.
        code = _server().run(
            cwd=copy,
            args=[
                *("-x", "-q", "-rfE", "-p", "no:cacheprovider", "-n", "0"),
                # pytest's plugins were imported before it started, so it cannot rewrite
                # their asserts (the tests' own are rewritten as ever)
                *("-W", "ignore::pytest.PytestAssertRewriteWarning"),
                *tests,
            ],
            env=env,
            log=log,
        )
        output = log.read_text(errors="replace")
        if not applied and code != 0:
            print(output[-6000:], flush=True)
        failed = [  # the short summary's lines (not a captured log's "ERROR ...")
            line.split(" ", 1)[1].split(" - ", 1)[0]
            for line in output.splitlines()
            if line.startswith(("FAILED tests/", "ERROR tests/"))
        ]
        return code, time.monotonic() - started, failed


class _Server:
    """A fork server (tests/mutation_server.py) of one worker thread: each run starts with
    pytest's plugins and the libraries the tests use already imported, about 5 s a run."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("mutation_server.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, *, cwd: Path, args: list[str], env: dict[str, str], log: Path) -> int:
        """pytest's exit code for ``args`` run in ``cwd`` with ``env``, its output in
        ``log``."""
        request = {"cwd": str(cwd), "args": args, "env": env, "log": str(log)}
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline()
        if not answer:
            raise SystemExit("the mutation check's fork server ended; run it again")
        return int(json.loads(answer)["code"])

    def close(self) -> None:
        """End the server (it stops at the end of its input), its pipes closed."""
        with self._process:  # closes the pipes and waits for the process
            assert self._process.stdin is not None
            self._process.stdin.close()


_SERVERS: list[_Server] = []
_SERVERS_LOCK = threading.Lock()
_THREAD = threading.local()


def _server() -> _Server:
    """This thread's fork server, started at its first run."""
    server: _Server | None = getattr(_THREAD, "server", None)
    if server is None:
        server = _THREAD.server = _Server()
        with _SERVERS_LOCK:
            _SERVERS.append(server)
    return server


def _killers(chosen: list[Mutation]) -> dict[str, str]:
    """The recorded first failing test of each chosen mutation, where it is still one of
    the mutation's guarding tests."""
    known = json.loads(KILLERS.read_text()) if KILLERS.exists() else {}
    return {
        m.name: known[m.name]
        for m in chosen
        if m.name in known and any(_within(known[m.name], test) for test in m.tests)
    }


def _within(test_id: str, guarding: str) -> bool:
    """Whether ``test_id`` is one of the tests ``guarding`` (a file, a test or a test id)
    names."""
    return test_id.split("::", 1)[0] == guarding or test_id.split("[", 1)[0] == guarding


_BASELINES: dict[tuple[str, ...], Future[tuple[bool, float]]] = {}
_BASELINES_LOCK = threading.Lock()


def _unchanged(mutation: Mutation, tests: tuple[str, ...]) -> tuple[bool, float]:
    """Whether ``tests`` pass on an unchanged copy, and the seconds this call waited: run
    once for each set of tests, however many mutations they guard."""
    with _BASELINES_LOCK:
        future = _BASELINES.get(tests)
        owner = future is None
        if future is None:
            future = _BASELINES[tests] = Future()
    if owner:
        code, seconds, _ = run(mutation, tests, applied=False)
        verdict = "passes" if code == 0 else "FAILED"
        print(f"{verdict:8} unchanged {', '.join(tests)} ({seconds:.0f} s)", flush=True)
        future.set_result((code == 0, seconds))
    started = time.monotonic()
    passed, _ = future.result()
    return passed, time.monotonic() - started


def _verdict(mutation: Mutation, killer: str | None) -> tuple[bool, float, str, list[str]]:
    """Whether ``mutation`` is killed, the seconds it took, the tests that decided it, and
    the tests that failed: its recorded killer alone first, if any, else (or if that one
    passes) all of its guarding tests, after they pass on an unchanged copy."""
    seconds = 0.0
    if killer is not None:
        code, seconds, failed = run(mutation, (killer,))
        if code == 1:  # a test failed (2 and above: pytest itself could not run)
            return True, seconds, killer, failed
    passed, took = _unchanged(mutation, mutation.tests)
    if not passed:
        raise SystemExit(f"{mutation.name}: its guarding tests fail on an unchanged copy")
    code, more, failed = run(mutation, mutation.tests)
    return code == 1, seconds + took + more, ", ".join(mutation.tests), failed  # as above


@contextmanager
def _servers_closed() -> Iterator[None]:
    """End every thread's fork server as the block ends, however it ends."""
    try:
        yield
    finally:
        with _SERVERS_LOCK:
            while _SERVERS:
                _SERVERS.pop().close()


def main(names: list[str], *, record: bool = False) -> int:
    """Run the chosen mutations (all without ``names``); ``record``: each against all of its
    guarding tests, and write the first test that kills each to ``KILLERS``."""
    chosen = [m for m in MUTATIONS if not names or m.name in names]
    killers = {} if record else _killers(chosen)
    survivors = []
    first: dict[str, str] = {}
    # Every run has a copy of its own, so they run side by side, one per core; a verdict
    # counts only if the tests that give it pass on an unchanged copy: the recorded killers,
    # in one share per core, queued first and checked once every verdict is in; the guarding
    # files of a mutation without one, before it runs.
    workers = os.cpu_count() or 1
    recorded = sorted(set(killers.values()))
    with _servers_closed(), ThreadPoolExecutor(max_workers=workers) as pool:
        shares = [recorded[i::workers] for i in range(workers) if recorded[i::workers]]
        baselines = [pool.submit(_unchanged, chosen[0], tuple(share)) for share in shares]
        verdicts = [pool.submit(_verdict, m, killers.get(m.name)) for m in chosen]
        for mutation, future in zip(chosen, verdicts, strict=True):
            killed, seconds, decided_by, failed = future.result()
            verdict = "killed" if killed else "SURVIVED"
            print(f"{verdict:8} {mutation.name} ({decided_by}, {seconds:.0f} s)", flush=True)
            if not killed:
                survivors.append(mutation.name)
            elif failed:
                first[mutation.name] = failed[0]
        if not all(baseline.result()[0] for baseline in baselines):
            print("the recorded killers fail on an unchanged copy: no verdict counts")
            return 1
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutations killed")
    if record:
        known = json.loads(KILLERS.read_text()) if KILLERS.exists() else {}
        known.update(first)
        KILLERS.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")
        print(f"recorded the first failing test of {len(first)} mutations in {KILLERS.name}")
    return 1 if survivors else 0


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if "--help" in arguments or "-h" in arguments:
        print(__doc__)
        raise SystemExit(0)
    chosen_names = [name for name in arguments if name != "--record"]
    raise SystemExit(main(chosen_names, record="--record" in arguments))
