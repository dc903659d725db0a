"""Drives the dashboard page of a running megatraind in headless Chromium (cdp.py) and checks
its DOM. Every wait is on the page's state, with a bound.
Usage: dashboard_probe.py live|unreachable|exposed|eval_replies|devices URL JOB_ID LAYERS DAEMON_PID OUT_DIR
  live:        the job is listed as RUNNING, its loss curve has points and grows, each layer has
               its four bars, the memory tiers and a healthy daemon are shown, a checkpoint's
               manifest matches its recorded hash; screenshots at a laptop's and a phone's
               width (the page must fit the phone's).
  unreachable: once the page shows the job, the daemon (DAEMON_PID) is killed and the page must
               say "daemon unreachable" (screenshot); then OUT_DIR/killed is written, the test
               starts the daemon again and the page must show it healthy again.
  exposed:     URL is an exposed daemon's https://.../login (self-signed certificate: Chromium
               runs with --ignore-certificate-errors): the token ($DASHBOARD_TOKEN) typed into the
               form logs in, the page shows the running job, follows the event stream, and its
               scripts cannot read the HttpOnly session cookie.
  eval_replies: the job is a fine-tuning job with $EVAL_PROMPTS_JSON as its data.eval_prompts:
               the job's detail shows a round of replies, one per prompt in order and as text (no
               element made from a prompt's HTML, none of its handlers run), then a later round
               without a reload (screenshot); then OUT_DIR/seen_live is written, the test pauses
               the job and writes OUT_DIR/expected.json ({"step", "replies": [[prompt, reply]...]},
               the daemon's last round), which the page must then show exactly.
  devices:     the devices panel (below) with a screenshot.
In every mode the page must follow the daemon's event stream (body[data-live] "events") and show
the daemon's devices ($EXPECT_DEVICES of them, 1 by default; with $EXPECT_ARENA_IN_USE=1 each
holding arena bytes)."""

import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cdp  # noqa: E402

mode, url, job_id, layers, daemon_pid, out_dir = sys.argv[1:7]
layers = int(layers)
profile = tempfile.mkdtemp(prefix="chromium-", dir=os.environ.get("TEST_TMPDIR"))
flags = ("--ignore-certificate-errors",) if url.startswith("https:") else ()
browser = cdp.Browser(os.environ.get("CHROMIUM", "chromium"), url, profile, flags=flags)
row = f'document.querySelector(\'#jobs tr[data-job-id="{job_id}"]\')'
status = 'document.getElementById("daemon-status").textContent'
report = {}


def wait_across_navigation(what, expression, timeout):
    """wait_for while the page navigates (an evaluation in a page being replaced fails)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return browser.wait_for(what, expression, max(1, deadline - time.monotonic()))
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


try:
    if mode == "exposed":
        browser.wait_for("the login form", '!!document.getElementById("token")', 60)
        token = json.dumps(os.environ["DASHBOARD_TOKEN"])
        browser.evaluate(f'document.getElementById("token").value = {token}; '
                         'document.querySelector("form").submit(); true')
        wait_across_navigation(f"job {job_id} in the job list after logging in", f"!!{row}", 60)
        report["cookie_visible_to_scripts"] = browser.evaluate("document.cookie")
        if "megatrain_session" in report["cookie_visible_to_scripts"]:
            raise AssertionError("the session cookie is readable by page scripts")
    browser.wait_for(f"job {job_id} in the job list", f"!!{row}", 60)
    browser.wait_for("the job shown as RUNNING",
                     f'{row}.querySelector(".state").textContent === "RUNNING"', 60)
    browser.wait_for("a healthy daemon", f'{status} === "healthy"', 60)
    browser.wait_for("the page to follow the event stream",
                     'document.body.dataset.live === "events"', 60)
    # The devices panel: every device the daemon drives ($EXPECT_DEVICES, one by default), each
    # healthy with its arena; with $EXPECT_ARENA_IN_USE=1 each holds arena bytes (a job trains on
    # every one of them).
    devices = int(os.environ.get("EXPECT_DEVICES", "1"))
    in_use = os.environ.get("EXPECT_ARENA_IN_USE") == "1"
    rows = '[...document.querySelectorAll("#devices .device")]'
    report["devices"] = browser.wait_for(
        f"{devices} healthy device(s) in the devices panel"
        + (", each with arena in use" if in_use else ""),
        f'{rows}.length === {devices} && '
        f'{rows}.every((d, i) => d.dataset.index === String(i) && d.dataset.healthy === "yes" && '
        f'd.textContent.includes("arena") && '
        f'(!{str(in_use).lower()} || !d.textContent.includes("arena 0 B"))) && '
        f'{rows}.map(d => d.textContent)', 60)
    if mode in ("live", "exposed"):
        browser.wait_for("the job's detail",
                         f'document.getElementById("job").dataset.jobId === "{job_id}"', 60)
        chart = 'document.getElementById("chart-loss")'
        report["loss_points"] = browser.wait_for(
            "two points on the loss curve",
            f'document.querySelector("#chart-loss polyline.loss") && '
            f'Number({chart}.dataset.points) >= 2 && Number({chart}.dataset.points)', 60)
        last = f"Number({chart}.dataset.lastStep)"
        report["last_step_first"] = browser.evaluate(last)
        report["last_step_later"] = browser.wait_for(
            "the loss curve to grow while the job trains",
            f'{last} > {report["last_step_first"]} && {last}', 120)
        bars = browser.wait_for(
            f"bars of {layers} layers",
            f'document.querySelectorAll("#layers g.layer").length === {layers} && '
            f'document.querySelectorAll("#layers g.layer rect").length', 60)
        if bars != 4 * layers:
            raise AssertionError(f"{bars} layer bars, expected {4 * layers} "
                                 "(copy-in, compute, copy-out, stall per layer)")
        report["layer_bars"] = bars
        tiers = browser.evaluate(
            '[...document.querySelectorAll("#memory .tier")].map(t => t.dataset.tier)')
        for tier in ("device", "pinned", "ram"):
            if tier not in tiers:
                raise AssertionError(f"memory tier {tier} missing: {tiers}")
        report["tiers"] = tiers
        report["checkpoints_matching"] = browser.wait_for(
            "a checkpoint whose manifest matches its recorded hash",
            'document.querySelectorAll(\'#checkpoints li[data-check="manifest_matches"]\').length', 60)
        browser.screenshot(os.path.join(out_dir, "dashboard.png"))
        # A phone's viewport: one column, nothing wider than the screen (the job table scrolls in
        # its own box), the charts redrawn at the new width on the next poll.
        browser.call("Emulation.setDeviceMetricsOverride", width=390, height=844,
                     deviceScaleFactor=2, mobile=True)
        report["phone_width"] = browser.wait_for(
            "the page to fit a phone's width",
            'document.documentElement.scrollWidth <= 390 && '
            'document.getElementById("chart-loss").getAttribute("viewBox").split(" ")[2] <= 390 && '
            'document.documentElement.scrollWidth', 30)
        browser.screenshot(os.path.join(out_dir, "dashboard-phone.png"))
    elif mode == "devices":  # the devices panel checked above; a picture of it
        browser.screenshot(os.path.join(out_dir, "dashboard_devices.png"))
    elif mode == "eval_replies":
        browser.wait_for("the job's detail",
                         f'document.getElementById("job").dataset.jobId === "{job_id}"', 60)
        prompts = json.loads(os.environ["EVAL_PROMPTS_JSON"])
        box = 'document.getElementById("eval")'
        shown = ('JSON.stringify([...document.querySelectorAll("#eval-replies li.eval-reply")]'
                 '.map(li => [li.querySelector(".prompt").textContent, '
                 'li.querySelector(".reply").textContent]))')
        report["first_round_step"] = int(browser.wait_for(
            "a round of eval replies",
            f'!{box}.hidden && document.querySelectorAll("#eval-replies li.eval-reply").length '
            f'=== {len(prompts)} && {box}.dataset.step', 120))
        first = json.loads(browser.evaluate(shown))
        if [p for p, _ in first] != prompts:
            raise AssertionError(f"prompts shown {[p for p, _ in first]}, expected {prompts}")
        report["later_round_step"] = int(browser.wait_for(
            "a later round of eval replies while the job trains",
            f'Number({box}.dataset.step) > {report["first_round_step"]} && {box}.dataset.step',
            180))
        injected = browser.evaluate(
            '!!document.getElementById("injected") || !!document.body.dataset.pwned || '
            'document.querySelectorAll("#eval img").length > 0')
        if injected:
            raise AssertionError("a prompt's HTML became elements on the page")
        browser.screenshot(os.path.join(out_dir, "dashboard-eval-replies.png"))
        open(os.path.join(out_dir, "seen_live"), "w").close()
        expected_path = os.path.join(out_dir, "expected.json")
        deadline = time.monotonic() + 180
        while not os.path.exists(expected_path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {expected_path} from the test within 180 s")
            time.sleep(0.2)
        with open(expected_path) as f:
            expected = json.load(f)
        # Both sides through the page's JSON.stringify: the same text compares equal.
        want = f'JSON.stringify({json.dumps(expected["replies"])})'
        browser.wait_for(
            f"the daemon's last round (after step {expected['step']}) on the page",
            f'{box}.dataset.step === "{int(expected["step"])}" && {shown} === {want}', 60)
        report["final_round"] = expected
    elif mode == "unreachable":
        os.kill(int(daemon_pid), signal.SIGKILL)
        browser.wait_for("the page to say the daemon is unreachable",
                         f'{status} === "daemon unreachable" && '
                         '!document.getElementById("unreachable").hidden', 30)
        report["banner"] = browser.evaluate('document.getElementById("unreachable").textContent')
        browser.screenshot(os.path.join(out_dir, "dashboard-unreachable.png"))
        # The test restarts the daemon once this file exists; the page must find it again.
        open(os.path.join(out_dir, "killed"), "w").close()
        browser.wait_for("the page to show the restarted daemon as healthy",
                         f'{status} === "healthy" && document.getElementById("unreachable").hidden',
                         120)
    else:
        raise ValueError(f"unknown mode {mode}")
    print(json.dumps(report))
finally:
    browser.close()
