// The console's only script: the timeline's live tail. The server sends each new
// event once over one EventSource; this places it on the timeline and in the tail.
"use strict";

(function () {
  const svg = document.getElementById("timeline");
  const tail = document.getElementById("live-tail");
  if (!svg || !tail || svg.dataset.following !== "yes") {
    return;
  }
  const NS = "http://www.w3.org/2000/svg";
  const low = Number(svg.dataset.low);
  const high = Number(svg.dataset.high);
  const x0 = Number(svg.dataset.x0);
  const x1 = Number(svg.dataset.x1);
  const laneHeight = Number(svg.dataset.laneHeight);
  const top = Number(svg.dataset.top);
  const marks = document.getElementById("marks");
  const markers = document.getElementById("markers");

  function x(seq) {
    return x0 + ((seq - low) / Math.max(1, high - low)) * (x1 - x0);
  }

  function laneY(agent) {
    const key = agent || "";
    for (const lane of svg.querySelectorAll("g.lane")) {
      if (lane.dataset.key === key) {
        return Number(lane.dataset.y);
      }
    }
    // A lane this window did not have: add one below the others.
    const count = svg.querySelectorAll("g.lane").length;
    const y = top + laneHeight * count + laneHeight / 2;
    const height = Number(svg.getAttribute("height")) + laneHeight;
    svg.setAttribute("height", String(height));
    svg.setAttribute("viewBox", "0 0 1200 " + height);
    const group = document.createElementNS(NS, "g");
    group.setAttribute("class", "lane");
    group.dataset.key = key;
    group.dataset.agent = key;
    group.dataset.y = String(y);
    const label = document.createElementNS(NS, "text");
    label.setAttribute("x", "8");
    label.setAttribute("y", String(y + 4));
    label.setAttribute("class", "label");
    label.textContent = key;
    group.appendChild(label);
    svg.querySelector("g.lane-labels").appendChild(group);
    return y;
  }

  function place(event) {
    if (event.seq > high) {
      return; // past the room this window left: the next page load shows it
    }
    const mark = document.createElementNS(NS, "rect");
    const y = laneY(event.agent);
    mark.setAttribute("class", "mark g-" + event.group);
    mark.setAttribute("x", String(x(event.seq) - 2));
    mark.setAttribute("y", String(y - 8));
    mark.setAttribute("width", "4");
    mark.setAttribute("height", "16");
    mark.dataset.seq = String(event.seq);
    const title = document.createElementNS(NS, "title");
    title.textContent = event.seq + " · " + event.text;
    mark.appendChild(title);
    marks.appendChild(mark);
    if (event.kind === "rewound") {
      const line = document.createElementNS(NS, "line");
      const at = x(event.seq);
      line.setAttribute("class", "rewind-marker");
      line.setAttribute("x1", String(at));
      line.setAttribute("x2", String(at));
      line.setAttribute("y1", "22");
      line.setAttribute("y2", String(Number(svg.getAttribute("height")) - 20));
      line.dataset.seq = String(event.seq);
      line.dataset.to = String(event.to);
      markers.appendChild(line);
      const hatch = document.createElementNS(NS, "rect");
      const left = x(Math.max(event.to + 0.5, low));
      hatch.setAttribute("class", "abandoned");
      hatch.setAttribute("x", String(left));
      hatch.setAttribute("y", "30");
      hatch.setAttribute("width", String(Math.max(1, at - left)));
      hatch.setAttribute("height", String(Number(svg.getAttribute("height")) - 48));
      hatch.setAttribute("fill", "url(#hatch)");
      hatch.setAttribute("fill-opacity", "0.55");
      hatch.dataset.first = String(event.to + 1);
      hatch.dataset.last = String(event.seq - 1);
      hatch.dataset.rewind = String(event.seq);
      svg.querySelector("g.hatches").appendChild(hatch);
    }
  }

  function remember(event) {
    const item = document.createElement("li");
    item.value = event.seq;
    item.dataset.seq = String(event.seq);
    item.className = "is-new";
    const where = event.agent ? event.agent + (event.session ? "/" + event.session : "") : "log";
    item.textContent = event.time + "  " + where + "  " + event.text;
    tail.insertBefore(item, tail.firstChild);
    while (tail.children.length > 200) {
      tail.removeChild(tail.lastChild);
    }
  }

  const source = new EventSource("/live?after=" + encodeURIComponent(tail.dataset.after));
  source.addEventListener("append", function (message) {
    const event = JSON.parse(message.data);
    place(event);
    remember(event);
  });
  source.addEventListener("reload", function () {
    source.close();
    const status = document.getElementById("live-status");
    if (status) {
      status.textContent = "Live updates stopped: reload the page to follow again.";
    }
  });
})();
