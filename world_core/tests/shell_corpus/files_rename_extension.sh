touch a.txt b.txt c.log
for f in *.txt; do mv "$f" "${f%.txt}.md"; done
ls
