"""A trace of speculative decoding, round by round, as data: what each round proposed, what the
verifier judged at each candidate (the target's p(x) there and, for a sampled guess, the draft's
q(x)), the path it accepted and the tokens it added. It listens on the loops' per-round hook
(`on_round`), so decoding without a trace does no tracing work; trace_page.py draws it.

In a round, candidates are numbered 0..n-1 in the order they were proposed, parent -1 being the root
(the last accepted token); "path" lists the accepted candidates from the root down. A candidate's
"verdict" is "accepted", "rejected" or null: never looked at, because its parent was rejected or an
elder sibling accepted.
"""
from decode.sampling import token_probs
from decode.verify import guess_distribution, residual, walk

NOT_JUDGED = dict(verdict=None, p=None, q=None)


class Trace:
    """The on_round hook's listener for one sequence: Trace(sampling).record(Round) after each round."""

    def __init__(self, sampling, lossy=False):
        self.sampling, self.lossy, self.rounds = sampling, lossy, []

    def record(self, outcome):
        candidates, verdict = outcome.candidates, outcome.verdict
        judged = self.judgements(outcome) if len(candidates) else {}
        side = candidates.side.tokens if candidates.side else []
        self.rounds.append(dict(
            held=outcome.held, width=outcome.width or candidates.checked_size(),
            candidates=[dict(token=token, parent=parent, **judged.get(i, NOT_JUDGED))
                        for i, (token, parent) in enumerate(zip(candidates.tokens, candidates.parents))],
            side=list(side), path=[c - 1 for c in verdict.path],
            added=[[token, source] for token, source in outcome.new]))

    def judgements(self, outcome):
        """{candidate: its verdict, p(x) and q(x)} for each candidate the verifier judged: its walk again,
        over the round's own logits, knowing which children it accepted. p is what was left of the
        target's distribution when x was tried (each rejected elder sibling's q taken out, as the
        exact verifier does); q is None for a deterministic guess (one-hot on x)."""
        candidates = outcome.candidates
        probs = token_probs(outcome.logits[:1 + len(candidates)], self.sampling)
        accepted, judged = set(outcome.verdict.path), {}

        def rule_at(node):
            p = probs[node]

            def accept(child):
                nonlocal p
                x, q = candidates.tokens[child - 1], guess_distribution(candidates, child, p)
                judged[child - 1] = dict(verdict="accepted" if child in accepted else "rejected", p=float(p[x]),
                                         q=None if candidates.draft_probs is None else float(q[x]))
                if child not in accepted and not (self.sampling.greedy or self.lossy):
                    p = residual(p, q)
                return child in accepted
            return accept, lambda: outcome.verdict.next_token

        walk(candidates, rule_at)
        return judged

    def as_dict(self, stats, token_text, **about):
        """The whole trace: `about` (method, setting, prompt...), the sampling, a summary from the
        run's DecodeStats, the rounds; token_text(id) gives each token's text."""
        texts = {}
        for r in self.rounds:
            for t in [c["token"] for c in r["candidates"]] + r["side"] + [t for t, _ in r["added"]]:
                texts.setdefault(t, token_text(t))
        depths = range(1, 1 + max((d for d, n in stats.depth_judged.items() if n), default=0))
        summary = dict(new_tokens=stats.new_tokens, rounds=stats.rounds, target_forwards=stats.target_forwards,
                       draft_forwards=stats.draft_forwards, tau=stats.tau, alpha=stats.alpha,
                       alpha_by_depth=[stats.acceptance_at(d) for d in depths], held=stats.held,
                       tokens_per_s=stats.tokens_per_s, seconds=stats.seconds)
        sampling = dict(greedy=self.sampling.greedy, temperature=self.sampling.temperature,
                        top_k=self.sampling.top_k, top_p=self.sampling.top_p, lossy=self.lossy)
        return dict(about, sampling=sampling, summary=summary, texts={str(t): s for t, s in texts.items()},
                    rounds=self.rounds)
