/* Offline stand-in for the jQuery + bootstrap-table calls in Great Expectations' Data Docs (which load them
   from CDNs): renders the index tables from the data GX embeds, rows linking to their pages; every other
   call is accepted and ignored, so the inline scripts run without errors and without the network. */
(function () {
  function renderTable(table, options) {
    var columns = options.columns || [], rows = options.data || [];
    var head = "<thead><tr>" + columns.map(function (c) { return "<th>" + (c.title || c.field) + "</th>"; }).join("") +
      "</tr></thead>";
    var body = rows.map(function (row) {
      var link = row._table_row_link_path;
      var cells = columns.map(function (c, i) {
        var value = row[c.field] == null ? "" : String(row[c.field]);
        return "<td>" + (link && i === 0 ? '<a class="ge-offline-row-link" href="' + link + '">' + value + "</a>" : value) + "</td>";
      }).join("");
      return "<tr" + (link ? ' data-href="' + link + '" style="cursor:pointer"' : "") + ">" + cells + "</tr>";
    }).join("");
    table.innerHTML = head + "<tbody>" + body + "</tbody>";
    table.classList.add("table");
    table.addEventListener("click", function (event) {
      var row = event.target.closest("tr[data-href]");
      if (row && !event.target.closest("a")) { window.location = row.getAttribute("data-href"); }
    });
  }
  function select(target) {
    var elements = typeof target === "string" ? Array.prototype.slice.call(document.querySelectorAll(target))
      : target ? [target] : [];
    var api = {
      bootstrapTable: function (options) {
        if (options && typeof options === "object") { elements.forEach(function (el) { renderTable(el, options); }); }
        return proxy;
      },
      ready: function (callback) {
        if (document.readyState !== "loading") { callback(); } else { document.addEventListener("DOMContentLoaded", callback); }
        return proxy;
      },
      length: elements.length
    };
    var proxy = new Proxy(api, {
      get: function (object, key) { return key in object ? object[key] : function () { return proxy; }; }
    });
    return proxy;
  }
  window.$ = window.jQuery = select;
})();
