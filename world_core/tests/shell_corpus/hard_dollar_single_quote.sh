printf '%s\n' $'line1\nline2' $'\x41\x42'
