echo input | { read -r v; echo "got $v"; }
