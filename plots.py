"""bench.py's plots (--plot DIR), drawn with matplotlib, and the machine line its reports share."""
import os
from contextlib import contextmanager

import cli


def machine(header):
    """The machine a report was measured on, as its first line and its plots' titles name it."""
    return (f"{header['device']}, {header['dtype']}{', compiled' if header['compiled'] else ''}, "
            f"{header['threads']} threads")


@contextmanager
def figure(directory, name, figsize, columns=1):
    """The axes of a new figure, written to DIR/name (DIR made if missing) when the block ends."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise cli.UserError("--plot needs matplotlib: pip install matplotlib") from None
    os.makedirs(directory, exist_ok=True)
    fig, axes = plt.subplots(1, columns, figsize=figsize)
    yield axes
    fig.tight_layout()
    fig.savefig(os.path.join(directory, name), dpi=120)
    plt.close(fig)


def plot_cost_curves(curves, header, directory, name):
    """DIR/name: r(n), one curve per {label: (r, seconds)}, beside the flat line of an ideal accelerator."""
    longest = max(len(r) for r, _ in curves.values())
    with figure(directory, name, (6, 4)) as ax:
        for label, (r, _) in curves.items():
            ax.plot(range(1, len(r) + 1), r, "o-", ms=3, label=label)
        ax.plot(range(1, longest + 1), [1.0] * longest, color="grey", lw=0.8,
                label="free extra tokens (the ideal accelerator)")
        ax.set_xlabel("tokens in one pass n")
        ax.set_ylabel("time / time of a 1-token step")
        ax.set_title(f"Verify-pass cost ({machine(header)})", fontsize=10)
        ax.legend(fontsize=8)


def plot(rows, r, header, directory):
    """DIR/cost_curve.png: r(n) as measured in this run; DIR/speedup.png: each row's measured
    speedup beside the cost model's prediction."""
    plot_cost_curves({"measured r(n)": (r, None)}, header, directory, "cost_curve.png")
    y = range(len(rows))
    with figure(directory, "speedup.png", (7, 0.28 * len(rows) + 1.2)) as ax:
        ax.barh([i - 0.2 for i in y], [row["speedup"] for row in rows], height=0.4, label="measured")
        ax.barh([i + 0.2 for i in y], [row["predicted_speedup"] for row in rows], height=0.4, label="predicted")
        ax.axvline(1.0, color="grey", lw=0.8)
        ax.set_yticks(list(y), [row["method"] for row in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("speedup over plain decoding")
        ax.set_title(f"{header['sampling']} ({machine(header)})", fontsize=10)
        ax.legend(fontsize=8)


def plot_batches(results, header, directory, plain_rows):
    """DIR/batch.png: total tokens/s against batch size for each row, and each row's measured and
    predicted speedup (but plain decoding's, `plain_rows`)."""
    with figure(directory, "batch.png", (11, 4), columns=2) as (left, right):
        for label in dict.fromkeys(r["method"] for r in results):
            mine = [r for r in results if r["method"] == label]
            sizes = [r["batch_size"] for r in mine]
            line, = left.plot(sizes, [r["tokens_per_s"] for r in mine], "o-", ms=3, label=label)
            if label not in plain_rows:
                right.plot(sizes, [r["speedup"] for r in mine], "o-", ms=3, color=line.get_color(), label=label)
                right.plot(sizes, [r["predicted_speedup"] for r in mine], "--", color=line.get_color(), lw=0.8)
        for ax, ylabel in ((left, "tokens/s, all rows together"), (right, "speedup over plain batched decoding")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size")
            ax.set_ylabel(ylabel)
        right.axhline(1.0, color="grey", lw=0.8)
        right.set_title("measured (solid) and predicted (dashed)", fontsize=9)
        left.set_title(f"{header['sampling']} ({machine(header)})", fontsize=9)
        left.legend(fontsize=7)
