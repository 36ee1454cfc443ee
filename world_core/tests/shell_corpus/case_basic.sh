for f in a.txt b.py c.md d; do
  case $f in
    *.txt) echo "$f text";;
    *.py|*.md) echo "$f code-or-doc";;
    *) echo "$f other";;
  esac
done
