printf 'x\ny\nx\nz\nx\ny\n' | sort | uniq -c | sort -rn
