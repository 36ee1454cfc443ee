printf 'Apple\nbanana\nAPRICOT\n' > g.txt
grep -i ap g.txt
grep -v an g.txt
