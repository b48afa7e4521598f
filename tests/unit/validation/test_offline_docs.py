"""Data Docs made usable offline: every page of the site loses its CDN requests and links our two files."""

from __future__ import annotations

from pathlib import Path

from fleetgen.validation.offline_docs import STATIC, external_references, make_offline

HEAD = ('<html><head><title>t</title>\n'
        '<link rel="stylesheet" href="https://cdn.example/bootstrap.min.css" integrity="x">\n'
        '<LINK href="//fonts.example/font-awesome.css" rel="stylesheet">\n'
        '<link rel="icon" href="static/images/favicon.ico">\n'
        '<script src="https://cdn.example/jquery.js"></script>\n'
        '<script src="http://cdn.example/vega.js" type="text/javascript">  </script>\n'
        '<script src="static/scripts/local.js"></script>\n'
        '</head><body>\n'
        '<img src="https://great-expectations-web-assets.s3.amazonaws.com/logo-long.png?d=20221102" alt="logo">\n'
        '<img src="//s3.example/a/b/logo.svg" class="x">\n'
        '<a href="https://docs.greatexpectations.io/">docs</a>\n'
        '</body></html>\n')


def write_site(root: Path) -> Path:
    site = root / "data_docs"
    for relative in ("index.html", "validations/suite/run/page.html", "expectations/suite.html"):
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_text(HEAD)
    (site / "static" / "images").mkdir(parents=True)
    (site / "notes.txt").write_text('<script src="https://cdn.example/untouched.js"></script>')
    return site


def test_every_page_loses_its_cdn_requests_and_links_the_offline_files_relative_to_itself(tmp_path):
    site = write_site(tmp_path)
    assert len(external_references(site)) == 3 * 6  # 2 links, 2 scripts, 2 images per page; the <a> is not fetched

    assert make_offline(site) == 3
    assert external_references(site) == []
    for relative, static in (("index.html", "static"), ("validations/suite/run/page.html", "../../../static"),
                             ("expectations/suite.html", "../static")):
        page = (site / relative).read_text()
        assert page == ('<html><head><title>t</title>\n\n\n'
                        '<link rel="icon" href="static/images/favicon.ico">\n\n\n'
                        '<script src="static/scripts/local.js"></script>\n'
                        f'<link rel="stylesheet" href="{static}/styles/offline.css">\n'
                        f'<script src="{static}/scripts/offline.js"></script>\n'
                        '</head><body>\n'
                        f'<img src="{static}/images/logo-long.png" alt="logo">\n'
                        f'<img src="{static}/images/logo.svg" class="x">\n'
                        '<a href="https://docs.greatexpectations.io/">docs</a>\n'
                        '</body></html>\n'), relative
    assert (site / "notes.txt").read_text().startswith('<script src="https://')  # only HTML pages are rewritten


def test_our_files_are_copied_into_the_sites_static_folder(tmp_path):
    site = tmp_path / "empty_site"
    site.mkdir()
    assert make_offline(site) == 0
    assert (site / "static" / "styles" / "offline.css").read_bytes() == (STATIC / "offline.css").read_bytes()
    assert (site / "static" / "scripts" / "offline.js").read_bytes() == (STATIC / "offline.js").read_bytes()
    make_offline(site)  # a second pass over an existing static/ folder is fine


def test_only_the_first_head_gets_the_offline_files(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<head></head><template><head></head></template>")
    make_offline(site)
    text = (site / "index.html").read_text()
    assert text.count("offline.css") == 1 and text.endswith("</head><template><head></head></template>")


def test_external_references_name_the_page_and_the_tag_cut_to_120_characters(tmp_path):
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    long_tag = '<IMG class="' + "c" * 150 + '" SRC="HTTPS://cdn.example/x.png">'
    (site / "sub" / "p.html").write_text('<a href="https://x.example/">x</a>'
                                         '<img src="local.png">' + long_tag + '<iframe src="//cdn.example/f">')
    found = external_references(site)
    assert found == [f"sub/p.html: {long_tag[:120]}", 'sub/p.html: <iframe src="//cdn.example/f">']
