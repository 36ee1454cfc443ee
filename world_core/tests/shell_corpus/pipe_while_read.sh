printf 'one\ntwo\nthree\n' | while read -r line; do echo "<$line>"; done
