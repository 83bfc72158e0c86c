// Search from file://. The theme runs its search in a Web Worker, and a browser refuses
// `new Worker(...)` for a page opened as file://. There, this runs the worker's script in
// a hidden iframe instead and passes messages both ways; served over http(s) it does
// nothing. (mkdocs-material's offline plugin would otherwise add a copy of such a shim
// from a CDN: it adds none when a polyfill's name contains "iframe-worker".)
(function () {
  if (location.protocol !== "file:") return;

  class FrameWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this.queue = [];
      const frame = document.createElement("iframe");
      frame.hidden = true;
      document.body.appendChild(frame);
      const scope = frame.contentWindow;
      this.scope = scope;
      // the worker's side: what it posts reaches the page; importScripts loads in order
      scope.postMessage = (data) => this.deliver(data);
      scope.importScripts = (...urls) => urls.reduce(
        (done, src) => done.then(() => FrameWorker.load(scope, src)), Promise.resolve());
      FrameWorker.load(scope, new URL(url, location.href).href).then(() => {
        const queued = this.queue;
        this.queue = null;
        queued.forEach((data) => this.postMessage(data));
      }, (error) => this.fail(error));
    }

    static load(scope, src) {
      return new Promise((resolve, reject) => {
        const script = scope.document.createElement("script");
        script.src = src;
        script.onload = resolve;
        script.onerror = () => reject(new Error(`could not load ${src}`));
        scope.document.head.appendChild(script);
      });
    }

    postMessage(data) {
      if (this.queue) {
        this.queue.push(data);
        return;
      }
      const event = new this.scope.MessageEvent("message", { data });
      setTimeout(() => this.scope.dispatchEvent(event));
    }

    deliver(data) {
      const event = new MessageEvent("message", { data });
      setTimeout(() => {
        this.dispatchEvent(event);
        if (this.onmessage) this.onmessage(event);
      });
    }

    fail(error) {
      const event = new ErrorEvent("error", { error, message: String(error) });
      this.dispatchEvent(event);
      if (this.onerror) this.onerror(event);
    }

    terminate() {
      this.queue = [];
    }
  }

  window.Worker = FrameWorker;
})();
