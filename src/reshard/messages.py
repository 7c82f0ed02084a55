"""Every sentence the CLI prints, in one catalogue, keyed by message id and language.

English is the default; ``--lang ko`` picks Korean (the language the row -> column example was first taught in) where a translation
exists and falls back to English otherwise.
"""

from __future__ import annotations

LANGS = ("en", "ko")

CATALOGUE: dict[str, dict[str, str]] = {
    "moe.title": {
        "en": "reshard explain --moe: {tokens} tokens on each of {ranks} local ranks ({engine}) grouped into {hosts} hosts; "
              "each token goes to {top_k} of {experts} experts (expert e on rank e). Run for real, both paths.",
        "ko": "reshard explain --moe: {ranks}개 로컬 rank({engine})를 {hosts}개 host로 묶고, rank마다 token {tokens}개; "
              "token마다 {experts}개 expert 중 {top_k}개로 보낸다 (expert e는 rank e에). 두 경로 모두 실제로 실행.",
    },
    "moe.box": {"en": "rank {rank} · host {host}", "ko": "rank {rank} · host {host}"},
    "moe.routing": {"en": "Routing (token -> its experts, and the hosts they sit on):",
                    "ko": "라우팅 (token -> 그 expert들, 그리고 expert가 있는 host):"},
    "moe.token_line": {"en": "  {token} (rank {rank}, host {host}) -> experts {experts} on hosts {hosts}",
                       "ko": "  {token} (rank {rank}, host {host}) -> expert {experts}, host {hosts}"},
    "moe.flat": {
        "en": "Flat: each (token, expert) pair travels straight to its expert's rank: {crossing} of {pairs} copies "
              "crossed between hosts.",
        "ko": "평면(flat): (token, expert) 쌍마다 expert의 rank로 곧장 간다: 사본 {pairs}개 중 {crossing}개가 host 사이를 건넜다.",
    },
    "moe.two": {
        "en": "Two levels: each token crosses ONCE to each other host that holds one of its experts (to the rank "
              "with its local index there), which copies it to those experts: {crossing} copies crossed between hosts.",
        "ko": "두 단계: token은 자기 expert가 있는 다른 host마다 한 번만 건너가고 (그 host에서 같은 local index의 rank로), "
              "그 rank가 expert들에게 복사해 준다: host 사이를 건넌 사본은 {crossing}개.",
    },
    "moe.same": {"en": "Each expert received the same rows on both paths (checked on every rank):",
                 "ko": "두 경로에서 각 expert가 받은 행은 같다 (모든 rank에서 확인):"},
    "moe.expert_line": {"en": "  rank {rank}'s expert: {rows}", "ko": "  rank {rank}의 expert: {rows}"},
    "moe.differ": {"en": "WRONG: the two paths gave the experts different rows", "ko": "오류: 두 경로가 expert에게 다른 행을 주었다"},
    "moe.combine": {
        "en": "Combine runs the way back. Flat sends every pair's row home ({flat} rows across); two levels add a "
              "token's rows on the expert's host first and send one row per (token, host) home ({two} rows across). "
              "With identity experts every token came back as {top_k} x itself: {ok}.",
        "ko": "combine은 되돌아가는 길이다. 평면은 쌍마다 행을 돌려보내고 (host 사이 {flat}행), 두 단계는 expert의 host에서 "
              "token의 행들을 먼저 더해 (token, host)마다 한 행만 돌려보낸다 (host 사이 {two}행). 항등 expert이므로 "
              "모든 token이 자기 자신의 {top_k}배로 돌아왔다: {ok}.",
    },
    "moe.bytes": {
        "en": "Bytes across hosts as rs.last_exchange() counted them (dispatch + combine, all ranks): flat {flat}, "
              "two levels {two} (its dispatch also carries each row's routing, k int64).",
        "ko": "rs.last_exchange()가 센 host 사이 바이트 (dispatch + combine, 모든 rank): 평면 {flat}, 두 단계 {two} "
              "(두 단계 dispatch는 행마다 라우팅 k개 int64도 함께 보낸다).",
    },
    "moe.yes": {"en": "yes", "ko": "예"},
    "moe.no": {"en": "NO", "ko": "아니오"},
    "moe.flat.title": {"en": "MoE dispatch, flat", "ko": "MoE dispatch, 평면"},
    "moe.flat.caption": {
        "en": "Each (token, expert) pair goes straight to the expert's rank: {crossing} of {pairs} copies cross between hosts.",
        "ko": "(토큰, 전문가) 쌍마다 전문가의 rank로 곧장 간다: 사본 {pairs}개 중 {crossing}개가 host 사이를 건넌다.",
    },
    "moe.across.title": {"en": "Two levels, 1: across hosts", "ko": "두 단계, 1: host 사이"},
    "moe.across.caption": {
        "en": "Each token goes once to each other host holding one of its experts, to the rank with its local index "
              "there (right column): {crossing} copies cross between hosts.",
        "ko": "토큰은 자기 전문가가 있는 다른 host마다 한 번, 그 host에서 같은 로컬 번호의 rank로 간다 (오른쪽 열): "
              "host 사이를 건너는 사본은 {crossing}개.",
    },
    "moe.inside.title": {"en": "Two levels, 2: inside each host", "ko": "두 단계, 2: 각 host 안"},
    "moe.inside.caption": {
        "en": "Each rank copies the tokens it holds to their experts on its own host; nothing crosses between hosts. "
              "The experts end with the same rows as on the flat path.",
        "ko": "각 rank는 가진 토큰을 자기 host의 전문가들에게 복사한다; host 사이로는 아무것도 건너지 않는다. "
              "전문가들은 평면 경로와 같은 행을 받는다.",
    },
    "demo.title": {
        "en": "reshard demo: {collective} as a layout exchange of A[{rows} x {cols}] ({dtype}) on {ranks} local ranks ({engine})",
        "ko": "reshard demo: A[{rows} x {cols}] ({dtype})를 {ranks}개 로컬 rank({engine})에서 {collective}로 layout 교환",
    },
    "demo.before": {"en": "Before: {placement}", "ko": "이전: {placement}"},
    "demo.after": {"en": "After: {placement} (redistribute used {collective})", "ko": "이후: {placement} (redistribute가 {collective} 사용)"},
    "demo.holds": {"en": "holds", "ko": "보유"},
    "demo.region": {"en": "region", "ko": "영역"},
    "demo.shape": {"en": "shape", "ko": "모양"},
    "demo.nothing": {"en": "nothing", "ko": "없음"},
    "demo.partial_sum": {"en": "partial sums of every block", "ko": "모든 블록의 부분합"},
    "demo.cut_rule": {
        "en": "Each rank cuts its block by destination and sends piece j to rank j:",
        "ko": "각 rank는 자기 블록을 목적지 기준으로 잘라 조각 j를 rank j에게 보낸다:",
    },
    "demo.stays": {"en": "(stays)", "ko": "(그대로)"},
    "demo.moved": {
        "en": "Moved: {sent} sent and {received} received per rank (own piece excluded); {summed}.",
        "ko": "이동: rank마다 {sent} 송신, {received} 수신 (자기 조각 제외); {summed}.",
    },
    "demo.moved_each": {
        "en": "Moved, sent / received by each rank (own piece excluded); {summed}:",
        "ko": "rank별 이동, 송신 / 수신 (자기 조각 제외); {summed}:",
    },
    "demo.not_summed": {"en": "no values were summed", "ko": "값을 더하지 않는다"},
    "demo.summed": {"en": "values were summed", "ko": "값을 더했다"},
    "demo.ok": {
        "en": "OK: all {ranks} ranks hold exactly their part of A under {placement} (checked against the full matrix, bit for bit).",
        "ko": "확인: {ranks}개 rank 모두 {placement}에서 자기 몫의 A를 정확히 보유 (전체 행렬과 비트 단위로 비교).",
    },
    "demo.bad": {
        "en": "WRONG: rank {rank} does not hold its part of A: {detail}",
        "ko": "오류: rank {rank}가 자기 몫의 A를 보유하지 않음: {detail}",
    },
    "demo.failed": {"en": "The demo failed: {error}", "ko": "demo 실패: {error}"},
    "demo.title_mesh": {
        "en": "reshard demo: A[{rows} x {cols}] ({dtype}) on a {mesh} process mesh of local ranks ({engine}), one planned exchange",
        "ko": "reshard demo: A[{rows} x {cols}] ({dtype})를 로컬 rank의 {mesh} process mesh({engine})에서 계획된 교환 한 번으로",
    },
    "demo.before_mesh": {"en": "Before: {placement}; the ranks as the mesh lays them out", "ko": "이전: {placement}; mesh 배치대로 그린 rank"},
    "demo.after_mesh": {"en": "After: {placement}", "ko": "이후: {placement}"},
    "demo.mesh_column": {"en": "mesh dim {dim} = {k}", "ko": "mesh 차원 {dim} = {k}"},
    "demo.partial_word": {"en": "a partial sum", "ko": "부분합"},
    "demo.moved_mesh": {
        "en": "Moved: at most {sent} sent and {received} received per rank: only what each rank needed and did not hold.",
        "ko": "이동: rank마다 최대 {sent} 송신, {received} 수신: 각 rank가 필요하지만 갖지 않은 것만.",
    },
    "demo.ok_mesh": {
        "en": "OK: all {ranks} ranks hold exactly their part of A under {placement} (checked against the full matrix, bit for bit).",
        "ko": "확인: {ranks}개 rank 모두 {placement}에서 자기 몫의 A를 정확히 보유 (전체 행렬과 비트 단위로 비교).",
    },
    "placement.Shard(0)": {"en": "row-sharded (Shard(0))", "ko": "행(row) 분할 (Shard(0))"},
    "placement.Shard(1)": {"en": "column-sharded (Shard(1))", "ko": "열(column) 분할 (Shard(1))"},
    "placement.Replicate()": {"en": "replicated (Replicate())", "ko": "복제 (Replicate())"},
    "placement.Partial()": {"en": "partial sums (Partial())", "ko": "부분합 (Partial())"},
    "explain.title": {
        "en": "reshard explain: five collectives on the same row-sharded A[{rows} x {cols}], {dtype} ({itemsize} B an element), over {ranks} local ranks ({engine}), measured",
        "ko": "reshard explain: 같은 행 분할 A[{rows} x {cols}] ({dtype}, 원소당 {itemsize} B)에 다섯 가지 collective를 {ranks}개 로컬 rank({engine})에서 실행하고 측정",
    },
    "explain.inputs": {
        "en": "Every rank starts with its row block (rows per rank: {sizes}). A's values are unique, and any sum of two is bigger than every single value, so sums show.",
        "ko": "각 rank는 자기 행 블록에서 시작한다 (rank별 행 수: {sizes}). A의 값은 모두 다르고 두 값의 합은 어떤 값보다 크므로 합은 드러난다.",
    },
    "explain.col.collective": {"en": "collective", "ko": "collective"},
    "explain.col.holds": {"en": "each rank holds afterwards", "ko": "이후 각 rank가 보유"},
    "explain.col.sums": {"en": "values summed?", "ko": "값을 더했나?"},
    "explain.col.full": {"en": "full tensor on every rank?", "ko": "모든 rank가 전체 tensor?"},
    "explain.col.bytes": {"en": "sent / received", "ko": "송신 / 수신"},
    "explain.col.memory": {"en": "peak memory (x one shard)", "ko": "최대 메모리 (shard 배수)"},
    "explain.some_rank": {"en": "one rank only", "ko": "한 rank만"},
    "explain.not_applicable": {"en": "not applicable here: {reason}", "ko": "여기서는 적용 불가: {reason}"},
    "explain.grids": {
        "en": "The row -> column example, blocks coloured by the rank holding them: before (Shard(0)), then after AllToAll (Shard(1)):",
        "ko": "row -> column 예제, 블록 색은 보유한 rank: 이전 (Shard(0)), 그리고 AllToAll 이후 (Shard(1)):",
    },
    "explain.grid_legend": {
        "en": "Aij:r is block (i, j) of A (row block i, column block j), held by rank r.",
        "ko": "Aij:r은 A의 블록 (i, j)(행 블록 i, 열 블록 j)이며 rank r이 보유한다.",
    },
    "explain.grid_legend.replicated": {"en": "Aij:* is held whole by every rank.", "ko": "Aij:*는 모든 rank가 통째로 보유한다."},
    "explain.grid_legend.partial": {"en": "Aij:+ is a partial sum on every rank.", "ko": "Aij:+는 모든 rank의 부분합이다."},
    "explain.q1": {"en": "Does AllToAll add values?", "ko": "AllToAll은 값을 더하는가?"},
    "explain.a1.no": {
        "en": "No. Each of the {elements} output elements equals exactly one input element (measured).",
        "ko": "아니다. 값을 더하지 않는다: 출력 원소 {elements}개 각각이 입력 원소 하나와 정확히 같다 (측정).",
    },
    "explain.a1.yes": {
        "en": "Yes. Some of the {elements} output elements are sums of several inputs (measured).",
        "ko": "그렇다. 출력 원소 {elements}개 중 일부는 여러 입력의 합이다 (측정).",
    },
    "explain.q2": {"en": "After AllToAll, does every rank hold the full tensor?", "ko": "AllToAll 후 모든 rank가 전체 tensor를 가지는가?"},
    "explain.a2.no": {
        "en": "No. The ranks hold parts of the full [{full}] ({shapes}): the layout changed, nothing was replicated.",
        "ko": "아니다. rank들은 전체 [{full}]의 일부만 가진다 ({shapes}): 복제하지 않고 layout을 바꾸는 것이다.",
    },
    "explain.a2.yes": {
        "en": "Yes. Every rank holds the full [{full}].",
        "ko": "그렇다. 모든 rank가 전체 [{full}]를 가진다.",
    },
    "explain.q3": {"en": "By what rule did each rank cut its block?", "ko": "각 rank는 어떤 규칙으로 자기 블록을 잘랐는가?"},
    "explain.a3": {
        "en": "By destination column range: piece j (the columns rank j owns) went to rank j. Read off what each rank received:",
        "ko": "목적지 열 범위 기준: 조각 j(rank j가 맡는 열)를 rank j에게 보냈다. 각 rank가 받은 것에서 읽은 표:",
    },
    "word.yes": {"en": "yes", "ko": "예"},
    "word.no": {"en": "no", "ko": "아니오"},
    "name.gather": {"en": "Gather (to rank 0)", "ko": "Gather (rank 0으로)"},
    "name.all_gather": {"en": "AllGather", "ko": "AllGather"},
    "name.reduce_scatter": {"en": "ReduceScatter (sum, cols)", "ko": "ReduceScatter (합, 열)"},
    "name.all_to_all": {"en": "AllToAll", "ko": "AllToAll"},
    "name.all_reduce": {"en": "AllReduce (sum)", "ko": "AllReduce (합)"},
    "plan.head": {
        "en": "{collective}: {src} -> {dst}, {shape} {dtype} over {ranks} ranks",
        "ko": "{collective}: {src} -> {dst}, {shape} {dtype}, rank {ranks}개",
    },
    "plan.split_table": {"en": "split table ({count} transfers between ranks):", "ko": "분할 표 (rank 사이 전송 {count}개):"},
    "span": {"en": "{low} to {high}", "ko": "{low}~{high}"},
    "over.the whole mesh": {"en": "the whole mesh", "ko": "mesh 전체"},
    "over.this rank": {"en": "this rank", "ko": "이 rank"},
    "over.mesh dim": {"en": "mesh dim {dim}", "ko": "mesh 차원 {dim}"},
    "over.the ranks": {"en": "the {ranks} ranks", "ko": "rank {ranks}개"},
    "plan.more": {"en": "... {count} more", "ko": "... {count}개 더"},
    "plan.traffic": {
        "en": "traffic: {pairs} rank pairs exchange {amount} each",
        "ko": "트래픽: rank 쌍 {pairs}개가 각각 {amount}를 주고받는다",
    },
    "plan.bytes": {
        "en": "bytes sent per rank: at most {most}; total on the wire {total} (a rank's own piece does not count)",
        "ko": "rank별 송신 바이트: 최대 {most}; 전체 전송량 {total} (자기 조각은 세지 않는다)",
    },
    "plan.memory": {
        "en": "memory per rank: before {before}, peak {peak}, after {after} (pack copies {pack}, unpack copies {unpack})",
        "ko": "rank별 메모리: 이전 {before}, 최대 {peak}, 이후 {after} (pack 복사 {pack}, unpack 복사 {unpack})",
    },
    "plan.time": {
        "en": "time estimate: {ms} ms (alpha-beta model: alpha {alpha:g} us per message, beta {beta:g} ns per byte)",
        "ko": "예상 시간: {ms} ms (alpha-beta 모델: 메시지당 alpha {alpha:g} us, 바이트당 beta {beta:g} ns)",
    },
    "cli.error": {"en": "error: {error}", "ko": "오류: {error}"},
    "meshplan.head": {
        "en": "redistribute {src} -> {dst} of [{shape}] {dtype} on mesh {mesh} ({ranks} ranks):",
        "ko": "[{shape}] {dtype}를 mesh {mesh}(rank {ranks}개)에서 {src} -> {dst}로 redistribute:",
    },
    "meshplan.head_world": {
        "en": "redistribute {src} -> {dst} of [{shape}] {dtype} over {ranks} ranks:",
        "ko": "[{shape}] {dtype}를 rank {ranks}개에서 {src} -> {dst}로 redistribute:",
    },
    "meshplan.nothing": {"en": "nothing moves: every rank already holds its part", "ko": "움직이는 것 없음: 모든 rank가 이미 자기 몫을 가진다"},
    "meshplan.step": {
        "en": "  {k}. {collective} over {over}: each rank sends {amount} ({total} in all), receives at most {most_in}",
        "ko": "  {k}. {over}에서 {collective}: rank마다 {amount} 송신 (전체 {total}), 최대 {most_in} 수신",
    },
    "meshplan.many": {
        "en": "In one call: {n} tensors, one check; every exchange of boxes in one step, each rank sending {amount} "
              "and receiving at most {most_in}",
        "ko": "한 번의 호출: 텐서 {n}개, 검사 한 번; 모든 상자 교환을 한 단계에서, 각 rank가 {amount}를 보내고 "
              "최대 {most_in}를 받음",
    },
    "meshplan.own": {
        "en": "; {own} tensor(s) reduced by their own steps after it",
        "ko": "; 텐서 {own}개는 그 뒤 자기 단계로 합산",
    },
    "meshplan.bound": {
        "en": "exchange: {total} on the wire; lower bound {bound} (what the ranks need and do not hold)",
        "ko": "교환: 전송량 {total}; 하한 {bound} (rank들이 필요하지만 갖지 않은 것)",
    },
    "meshplan.matrix": {"en": "traffic matrix (row: sender, column: receiver):", "ko": "트래픽 행렬 (행: 송신, 열: 수신):"},
    "cli.wrote": {"en": "wrote {path} ({what})", "ko": "{path} 작성 ({what})"},
    "cli.png": {"en": "PNG picture: before and after", "ko": "PNG 그림: 전과 후"},
    # the pictures (PNG and HTML): their titles, each collective's scene, the legend
    "picture.title_demo": {"en": "A[{rows} x {cols}] over {ranks} ranks: {src} -> {dst}",
                           "ko": "A[{rows} x {cols}], rank {ranks}개: {src} -> {dst}"},
    "picture.title_mesh": {"en": "A[{rows} x {cols}] on a {mesh} mesh: {placements}",
                           "ko": "A[{rows} x {cols}], {mesh} mesh: {placements}"},
    "picture.title_explain": {"en": "Five collectives on A[{rows} x {cols}] over {ranks} ranks",
                              "ko": "rank {ranks}개에서 A[{rows} x {cols}]에 대한 다섯 collective"},
    "picture.title_moe": {"en": "{what}: {ranks} ranks, {hosts} hosts", "ko": "{what}: rank {ranks}개, host {hosts}개"},
    "picture.values": {"en": "rank {rank}'s values", "ko": "rank {rank}의 값"},
    "picture.nothing": {"en": "nothing\n(None)", "ko": "없음\n(None)"},
    "picture.change": {"en": "{src} -> {dst}", "ko": "{src} -> {dst}"},
    "picture.change_mesh": {"en": "{src} -> {dst} on a {mesh} mesh", "ko": "{mesh} mesh에서 {src} -> {dst}"},
    "scene.title.gather": {"en": "Gather (to rank 0)", "ko": "Gather (rank 0으로)"},
    "scene.title.all_gather": {"en": "AllGather", "ko": "AllGather"},
    "scene.title.reduce_scatter": {"en": "ReduceScatter (sum, by columns)", "ko": "ReduceScatter (합, 열 기준)"},
    "scene.title.all_to_all": {"en": "AllToAll", "ko": "AllToAll"},
    "scene.title.all_reduce": {"en": "AllReduce (sum)", "ko": "AllReduce (합)"},
    "scene.caption.gather": {
        "en": "Every rank sends its row block to rank 0, which ends with the whole matrix; the others get nothing.",
        "ko": "모든 rank가 자기 행 블록을 rank 0에 보내고, rank 0이 행렬 전체를 갖는다. 나머지 rank는 아무것도 받지 않는다.",
    },
    "scene.caption.all_gather": {
        "en": "Every rank sends its row block to every rank: each ends with the whole matrix (replicated).",
        "ko": "모든 rank가 자기 행 블록을 모든 rank에 보낸다: 각 rank가 행렬 전체를 갖는다 (복제).",
    },
    "scene.caption.reduce_scatter": {
        "en": "Every rank holds a full-size partial sum. Block column j of every rank goes to rank j and is added up "
              "there: each rank ends with its columns of the sum.",
        "ko": "모든 rank가 전체 크기의 부분합을 갖는다. 모든 rank의 열 블록 j가 rank j로 가서 더해진다: 각 rank는 "
              "합의 자기 열을 갖는다.",
    },
    "scene.caption.all_to_all": {
        "en": "Each rank cuts its row block by destination column range and sends piece j to rank j: each rank ends "
              "with all rows of its own columns. Nothing is added, nothing is replicated.",
        "ko": "각 rank가 자기 행 블록을 목적지 열 범위별로 잘라 조각 j를 rank j에 보낸다: 각 rank는 자기 열의 모든 "
              "행을 갖는다. 더하는 것도 복제하는 것도 없다.",
    },
    "scene.caption.all_reduce": {
        "en": "Every rank holds a full-size partial sum; every rank ends with the whole sum.",
        "ko": "모든 rank가 전체 크기의 부분합을 갖는다. 모든 rank가 합 전체를 갖게 된다.",
    },
    "scene.legend.solid": {"en": "a block moved unchanged (coloured by the rank it came from)",
                           "ko": "그대로 옮겨진 블록 (온 rank의 색)"},
    "scene.legend.partial": {"en": "a partial sum: the ranks' values add up to the block",
                             "ko": "부분합: rank들의 값을 더하면 블록이 된다"},
    "scene.legend.sum": {"en": "the sum of every rank's partial values (stripes: whose)",
                         "ko": "모든 rank 부분값의 합 (줄무늬: 누구의 값인지)"},
    "page.style.solid": {"en": "solid: a block moved unchanged, coloured by the rank it came from",
                         "ko": "단색: 그대로 옮겨진 블록, 온 rank의 색"},
    "page.style.partial": {"en": "hatched: a partial sum", "ko": "빗금: 부분합"},
    "page.style.sum": {"en": "\u03a3, striped: the sum of the ranks' partial values",
                       "ko": "\u03a3, 줄무늬: rank들 부분값의 합"},
    "picture.no_korean_font": {
        "en": "no font with Korean glyphs was found, so the picture's Korean text shows as boxes: "
              "pip install koreanize-matplotlib (it comes with reshard[plot]), or on Debian apt-get install fonts-noto-cjk",
        "ko": "한글 글꼴을 찾지 못해 그림의 한글이 네모로 보인다: pip install koreanize-matplotlib "
              "(reshard[plot]에 포함), 또는 Debian에서 apt-get install fonts-noto-cjk",
    },
    "cli.html": {"en": "HTML page: open it in a browser to play each exchange; add #final for the last frame",
                 "ko": "HTML 페이지: 브라우저에서 열면 교환을 재생한다; #final을 붙이면 마지막 장면"},
    "explain.sums": {"en": "the sum of the {ranks} ranks' partial values, {cols}",
                     "ko": "{ranks}개 rank 부분합의 합, {cols}"},
    "explain.partial_inputs": {
        "en": "ReduceScatter and AllReduce start from Partial inputs, as gradients do: every rank holds a full-size partial sum, and the tensor is their sum.",
        "ko": "ReduceScatter와 AllReduce는 gradient처럼 Partial 입력에서 시작한다: 모든 rank가 전체 크기의 부분합을 갖고, tensor는 그 합이다.",
    },
}


# English plurals of "{ranks} ranks" and their singular, longest first
_ONE_RANK = (("all {ranks} ranks hold exactly their", "the {ranks} rank holds exactly its"),
             ("{ranks} local ranks", "{ranks} local rank"), ("{ranks} ranks'", "{ranks} rank's"),
             ("{ranks} ranks", "{ranks} rank"))


def say(key: str, lang: str = "en", **fields: object) -> str:
    """The message ``key`` in ``lang`` (English when there is no translation), filled in."""
    entry = CATALOGUE.get(key)
    if entry is None:
        raise KeyError(f"no message {key!r} in the catalogue")
    text = entry.get(lang) or entry["en"]
    if fields.get("ranks") == 1 and text is entry["en"]:  # English counts one rank in the singular
        for many, one in _ONE_RANK:
            text = text.replace(many, one)
    return text.format(**fields)


def byte_span(low: str, high: str, lang: str = "en") -> str:
    """``low`` alone where it equals ``high`` (every rank alike), else the range."""
    return low if low == high else say("span", lang, low=low, high=high)


def over_words(over: str, lang: str = "en") -> str:
    """Where a mesh plan's step runs (``the whole mesh``, ``mesh dim 1``, ``this rank``), in ``lang``."""
    if over.startswith("mesh dim "):
        return say("over.mesh dim", lang, dim=over.removeprefix("mesh dim "))
    key = f"over.{over}"
    return say(key, lang) if key in CATALOGUE else over


def placement_words(placement: object, lang: str = "en") -> str:
    key = f"placement.{placement!r}"
    return say(key, lang) if key in CATALOGUE else repr(placement)
