printf 'start\nx\nend\ny\n' | sed -n '/start/,/end/p'
