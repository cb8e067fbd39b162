#!/usr/bin/env python3
"""The web pages in a real browser: Debian's chromium, headless, driven by python3-selenium through
chromium-driver. Starts strata-server (with an API key) on a generated demo model, chats on `/`
(the key prompt, streaming, stop, edit-and-resend with cache_n), then checks that every chart of
`/dashboard` drew data, and that --no-webui turns the pages off. Screenshots go to --artifacts.

Exit 77 (ctest: skipped) when chromium, chromium-driver or python3-selenium is missing."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = None

API_KEY = "webui-test-key"
ARGS = None


def find_browser():
    for b in ("chromium", "chromium-browser"):
        if shutil.which(b):
            return shutil.which(b)
    return None


class Server:
    """strata-server on a free port; its log lines are collected for the cancellation check."""

    def __init__(self, binary, model, *flags):
        self.lines = []
        self.proc = subprocess.Popen([binary, "-m", model, "--port", "0", *flags], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.ready = threading.Event()
        self.base = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.ready.wait(60):
            self.stop()
            raise RuntimeError("strata-server did not become ready in 60 s:\n" + "".join(self.lines))

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.search(r"Listening on (http://\S+) ", line)
            if m:
                self.base = m.group(1)
            if "Ready." in line:
                self.ready.set()

    def wait_for_log(self, pattern, timeout=20):
        until = time.time() + timeout
        while time.time() < until:
            for line in self.lines:
                m = re.search(pattern, line)
                if m:
                    return m
            time.sleep(0.1)
        raise AssertionError(f"no server log line matched {pattern!r} within {timeout} s")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(10)
        if not self.reader.is_alive():
            self.proc.stdout.close()


def get(url, key=None, body=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class WebUi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="strata-webui-")
        cls.model = os.path.join(cls.tmp, "demo.gguf")
        subprocess.run([ARGS.make_model, "--preset", "demo", "-o", cls.model], check=True, stdout=subprocess.DEVNULL)
        cls.server = Server(ARGS.server, cls.model, "--api-key", API_KEY)
        options = webdriver.ChromeOptions()
        options.binary_location = find_browser()
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900",
                  f"--user-data-dir={cls.tmp}/profile"):
            options.add_argument(a)
        cls.driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        cls.driver.set_script_timeout(30)
        os.makedirs(ARGS.artifacts, exist_ok=True)

    @classmethod
    def tearDownClass(cls):
        cls.driver.quit()
        cls.server.stop()
        with open(os.path.join(ARGS.artifacts, "server.log"), "w") as f:
            f.write("".join(cls.server.lines))
        shutil.rmtree(cls.tmp, ignore_errors=True)

    # ---- helpers

    def wait(self, what, timeout=30):
        return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(lambda d: what())

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    def set_field(self, element_id, value):
        self.js("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                "e.dispatchEvent(new Event('input'));", element_id, value)

    def type_into(self, element, *keys):
        # A click first: after the page focuses the box from script, headless Chromium drops typed text
        # until the box is clicked.
        element.click()
        element.send_keys(*keys)

    def idle(self):
        return self.driver.find_element(By.ID, "stop").get_attribute("hidden") is not None

    def last_answer(self):
        return self.js("const a = document.querySelectorAll('.message.assistant'); const m = a[a.length - 1];"
                       "return m ? {text: m.querySelector('.content').textContent, stats: m.querySelector('.stats').textContent,"
                       "cache_n: m.querySelector('.stats').dataset.cacheN, ttft: m.querySelector('.stats').dataset.ttftMs,"
                       "error: (m.querySelector('.error') || {}).textContent} : null;")

    def record_growth(self):
        # Each change of the newest answer's text, as the page renders it.
        self.js("""window.__growth = [];
            new MutationObserver(() => {
              const a = document.querySelectorAll('.message.assistant .content');
              const n = a.length ? a[a.length - 1].textContent.length : 0;
              const g = window.__growth;
              if (!g.length || g[g.length - 1] !== n) g.push(n);
            }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});""")

    # ---- the chat page, in order

    def test_1_chat_streams_after_the_key_prompt(self):
        d = self.driver
        d.get(self.server.base + "/")
        self.wait(lambda: "marked 4.2" in d.find_element(By.ID, "about").text)
        about = d.find_element(By.ID, "about").text
        for lib in ("marked", "highlight.js", "Chart.js"):
            self.assertIn(lib, about)
        # Long enough in wall time (seconds on the demo model) that a streaming page renders it in many
        # steps even when a loaded machine coalesces the stream's reads.
        self.set_field("max_tokens", "1500")
        self.set_field("extra", '{"ignore_eos": true}')
        self.record_growth()
        self.type_into(d.find_element(By.ID, "input"), "Hello there", Keys.ENTER)
        # The server has a key: the page asks for it, then sends again.
        dialog = self.wait(lambda: d.find_element(By.ID, "key-dialog") if d.find_element(By.ID, "key-dialog").get_attribute("open") is not None else None)
        dialog.find_element(By.CSS_SELECTOR, "input").send_keys(API_KEY)
        dialog.find_element(By.CSS_SELECTOR, "button[value=save]").click()
        self.wait(lambda: self.idle() and self.last_answer() and self.last_answer()["cache_n"] is not None, 60)
        a = self.last_answer()
        self.assertFalse(a["error"], a)
        growth = self.js("return window.__growth;")
        steps = [n for n in growth if n > 0]
        self.assertGreaterEqual(len(steps), 4, f"the answer appeared in {len(steps)} steps: {growth}")
        self.assertEqual(steps, sorted(steps), growth)
        self.assertIn("1500 tok at", a["stats"])
        self.assertIn("first token", a["stats"])
        self.assertEqual(self.js("return localStorage.getItem('strata.apiKey');"), API_KEY)
        print(f"answer 1: {len(steps)} render steps, stats: {a['stats']}")

    def test_2_stop_cancels_on_the_server(self):
        d = self.driver
        self.set_field("max_tokens", "3000")
        self.type_into(d.find_element(By.ID, "input"), "Tell me a long story", Keys.ENTER)
        self.wait(lambda: not self.idle() and self.last_answer() and len(self.last_answer()["text"]) > 40)
        d.find_element(By.ID, "stop").click()
        self.wait(self.idle)
        a = self.last_answer()
        self.assertIn("stopped", a["stats"])
        m = self.server.wait_for_log(r"Request (\d+) \(chat\) finished: .*decode (\d+) tokens.*stopped by client disconnected")
        self.assertLess(int(m.group(2)), 3000, "the generation ran to max_tokens instead of stopping")
        print(f"stopped after {len(a['text'])} characters; server: request {m.group(1)} decoded {m.group(2)} tokens")

    def test_3_edit_and_resend_shows_cache_n(self):
        d = self.driver
        self.set_field("max_tokens", "40")
        d.find_element(By.CSS_SELECTOR, ".actions .edit").click()
        area = self.wait(lambda: d.find_element(By.CSS_SELECTOR, ".edit-box"))
        area.clear()
        self.type_into(area, "Tell me a short story instead")
        d.find_element(By.CSS_SELECTOR, ".actions .resend").click()
        self.wait(lambda: self.idle() and self.last_answer()["cache_n"] is not None, 60)
        a = self.last_answer()
        users = self.js("return [...document.querySelectorAll('.message.user')].map(e => e.querySelector('.content').textContent);")
        self.assertEqual(users, ["Hello there", "Tell me a short story instead"])
        reused = [int(x) for x in re.findall(r"\((\d+) reused", "".join(self.server.lines))]
        self.assertGreater(int(a["cache_n"]), 0, a)
        self.assertEqual(int(a["cache_n"]), reused[-1], f"page shows cache_n {a['cache_n']}, the server reused {reused}")
        self.assertIn(f"cache_n {a['cache_n']}", a["stats"])
        d.save_screenshot(os.path.join(ARGS.artifacts, "chat.png"))
        # On a phone's width: no sideways scrolling, the conversation list folded away.
        d.set_window_size(390, 844)
        self.wait(lambda: self.js("return window.innerWidth;") <= 400)
        self.assertLessEqual(self.js("return document.documentElement.scrollWidth;"), self.js("return window.innerWidth;"))
        self.assertFalse(d.find_element(By.ID, "sidebar").is_displayed())
        d.save_screenshot(os.path.join(ARGS.artifacts, "chat-phone.png"))
        d.set_window_size(1280, 900)
        print(f"edited and resent: {a['stats']}")

    # ---- the dashboard

    def test_4_dashboard_draws_every_chart(self):
        d = self.driver
        d.set_window_size(1400, 1300)
        d.get(self.server.base + "/dashboard")
        self.wait(lambda: self.js("return window.strataDashboard && window.strataDashboard.polls;") >= 1)
        # A generation while the dashboard watches: the queue chart sees it run and finish.
        t = threading.Thread(target=get, args=(self.server.base + "/v1/chat/completions", API_KEY,
                                               {"messages": [{"role": "user", "content": "Count to ten"}],
                                                "max_tokens": 400, "ignore_eos": True}))
        t.start()
        t.join()
        self.wait(lambda: self.js("return window.strataDashboard.polls;") >= 6, 30)
        charts = self.js("""const out = {};
            for (const [name, c] of Object.entries(window.strataDashboard.charts)) {
              const values = c.data.datasets.flatMap(ds => ds.data.map(p => typeof p === 'object' ? p.y : p));
              const g = c.canvas.getContext('2d').getImageData(0, 0, c.canvas.width, c.canvas.height).data;
              let painted = 0;
              for (let i = 3; i < g.length; i += 4) if (g[i] > 0) ++painted;
              out[name] = {points: Math.min(...c.data.datasets.map(ds => ds.data.length)), nonzero: values.filter(v => v > 0).length,
                           painted, hidden: c.canvas.closest('.card').classList.contains('off')};
            }
            return out;""")
        for name, c in charts.items():
            if name == "vram":
                # CPU only: the card says the GPU path is off instead of charting zeros.
                self.assertTrue(c["hidden"], charts)
                self.assertIn("GPU hybrid is off", d.find_element(By.ID, "vram-note").text)
                continue
            self.assertGreaterEqual(c["points"], 1, f"{name}: {c}")
            self.assertGreater(c["nonzero"], 0, f"{name} drew no data: {c}")
            self.assertGreater(c["painted"], 1000, f"{name}: {c}")
        queue = self.js("return window.strataDashboard.charts.queue.data.datasets.map(d => Math.max(...d.data.map(p => p.y)));")
        self.assertGreaterEqual(queue[1] + queue[2], 1, f"the queue chart never saw the generation: {queue}")
        cells = self.js("return window.strataDashboard.heatmapCells;")
        self.assertEqual(cells, 4 * 16, "the demo model has 4 layers of 16 experts, each routed to by now")
        d.save_screenshot(os.path.join(ARGS.artifacts, "dashboard.png"))
        print(f"dashboard: {json.dumps(charts)}; heatmap cells {cells}")

    def test_5_no_webui_turns_the_pages_off(self):
        off = Server(ARGS.server, self.model, "--no-webui")
        try:
            for path in ("/", "/dashboard", "/webui/lib/chart.js"):
                status, body = get(off.base + path)
                self.assertEqual(status, 404, path)
                self.assertIn(b"--no-webui", body)
            self.assertEqual(get(off.base + "/health")[0], 200)
        finally:
            off.stop()


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--make-model", required=True)
    p.add_argument("--artifacts", required=True)
    ARGS, rest = p.parse_known_args()
    missing = [n for n, ok in (("chromium", find_browser()), ("chromium-driver", shutil.which("chromedriver")),
                               ("python3-selenium", webdriver)) if not ok]
    if missing:
        print(f"webui: skipped: {', '.join(missing)} not installed (tools/install-deps.sh installs them)")
        return 77
    result = unittest.main(argv=[sys.argv[0], "-v", *rest], exit=False).result
    passed = result.testsRun - len(result.failures) - len(result.errors) - len(result.skipped)
    print(f"webui: {passed} passed, {len(result.failures) + len(result.errors)} failed; screenshots in {ARGS.artifacts}")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
